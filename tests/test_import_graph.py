"""The project's imports form no cycle, between modules nor between packages, and the core (runtime, presses,
allocators) never reaches into the bench, GateSight's learning pipeline or the default model's training. Every import
counts, the lazy ones inside functions included: a cycle through a lazy import still ties the two modules together."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# every top-level package of the project (a folder with an __init__.py beside pyproject.toml)
PACKAGES = tuple(sorted(path.parent.name for path in ROOT.glob("*/__init__.py")))
CORE = ("runtime", "presses", "allocators")
OUTER = ("bench", "gatesight_learning", "hybridmodel")
TEST_SUPPORT = ("testing", "tests")
"""What only tests, benchmarks and scripts import: the shared test support and the tests themselves."""


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """``{module: the project's modules it imports}`` over :data:`PACKAGES`."""
    files = {_module(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    graph = {}
    for module, path in files.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                anchor = package[: len(package) - node.level + 1] if node.level else []
                base = ".".join(anchor + ([node.module] if node.module else []))
                # ``from pkg import name``: the submodule pkg.name if there is one, else an attribute of pkg
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in node.names]
            else:
                continue
            for name in names:
                while name and name not in files:
                    name = name.rpartition(".")[0]
                # a module's own packages are imported before it anyway: no edge back to them
                if name and not (module == name or module.startswith(name + ".")):
                    imported.add(name)
        graph[module] = imported
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    order, low, stack, found = {}, {}, [], []

    def visit(module):
        order[module] = low[module] = len(order)
        stack.append(module)
        for other in graph[module]:
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for module in graph:
        if module not in order:
            visit(module)
    return found


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_core_never_imports_the_outer_packages():
    forbidden = [f"{module} -> {other}" for module, imported in import_graph().items() for other in imported
                 if module.split(".")[0] in CORE and other.split(".")[0] in OUTER]
    assert forbidden == []


def test_no_library_imports_the_test_support():
    """The tiny models, offline presses and kvpress parity (``testing/``) may import any library package; no library
    package imports them, nor the tests."""
    found = [f"{module} -> {other}" for module, imported in import_graph().items() for other in imported
             if module.split(".")[0] not in TEST_SUPPORT and other.split(".")[0] in TEST_SUPPORT]
    assert found == []


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``{package: the other top-level packages its modules import}``."""
    packages: dict[str, set[str]] = {module.split(".")[0]: set() for module in graph}
    for module, imported in graph.items():
        packages[module.split(".")[0]] |= {other.split(".")[0] for other in imported} - {module.split(".")[0]}
    return packages


def test_no_package_imports_a_package_that_imports_it():
    """Floors: no package reaches one that reaches it back, directly or through others (the CLI, bench, on top)."""
    graph = import_graph()
    found = cycles(package_graph(graph))
    tied = {package for cycle in found for package in cycle}
    top = lambda module: module.split(".")[0]  # noqa: E731
    back = sorted(f"{module} -> {other}" for module, imported in graph.items() for other in imported
                  if top(module) != top(other) and {top(module), top(other)} <= tied)
    assert found == [], back


def test_the_packages_are_all_seen():
    assert {"runtime", "presses", "allocators", "workloads", "artifacts", "pretrained", "bench", "serving",
            "testing"} <= set(PACKAGES)


def test_a_package_cycle_is_found():
    graph = {"a.x": {"b.y"}, "b.y": {"c"}, "c": {"a.z"}, "a.z": set(), "d": {"a.x"}}
    assert cycles(package_graph(graph)) == [["a", "b", "c"]]


def test_a_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]

"""The project's imports form no cycle, between modules nor between packages, and the core (runtime, presses,
allocators) never reaches into the bench, GateSight's learning pipeline or the default model's training. Every import
counts, the lazy ones inside functions included: a cycle through a lazy import still ties the two modules together."""

from bench.store.project_modules import imported_modules, module_files

# every top-level package of the project (a folder with an __init__.py beside pyproject.toml)
PACKAGES = tuple(sorted({module.split(".")[0] for module in module_files()}))
CORE = ("runtime", "presses", "allocators")
OUTER = ("bench", "gatesight_learning", "hybridmodel")
TEST_SUPPORT = ("testing", "tests")
"""What only tests, benchmarks and scripts import: the shared test support and the tests themselves."""


def import_graph() -> dict[str, set[str]]:
    """``{module: the project's modules it imports}`` over :data:`PACKAGES`, by the walk the code version takes
    (:func:`bench.store.project_modules.imported_modules`)."""
    files = module_files()
    # a module's own packages are imported before it anyway: no edge back to them
    return {module: {name for name in imported_modules(module, files)
                     if not (module == name or module.startswith(name + "."))} for module in files}


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


ROOMS = {"store": set(), "run": {"store"}, "reports": {"store"}, "commands": {"store", "run", "reports"}}
"""The bench's four rooms (docs/design.md) and the rooms each may import: the commands on top, the run and the
reports each reading the store and neither the other, the store reading none."""
ENTRY = "bench.entry"
"""The console script: the one module beside the rooms, and the one outside the commands that imports them."""


def room_of(module: str) -> str | None:
    """The room of a bench module (``bench.<room>.<module>``), None for any other."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "bench" and parts[1] in ROOMS else None


def test_every_bench_module_is_in_a_room():
    stray = [module for module in import_graph() if module.startswith("bench.") and room_of(module) is None
             and module != ENTRY]
    assert stray == []


def going_up(graph: dict[str, set[str]]) -> list[str]:
    """``module -> other`` for each import of ``graph`` from a room into one it may not import (:data:`ROOMS`)."""
    return sorted(f"{module} -> {other}" for module, imported in graph.items() for other in imported
                  if room_of(module) and room_of(other) and room_of(other) not in {room_of(module),
                                                                                   *ROOMS[room_of(module)]})


def test_the_rooms_import_only_the_rooms_below():
    assert going_up(import_graph()) == []


def test_nothing_imports_the_commands_but_the_console_script():
    """Tests aside (they drive the CLI), no module outside ``bench.commands`` imports it: a library caller's path
    never runs argument parsing."""
    found = [f"{module} -> {other}" for module, imported in import_graph().items() for other in imported
             if room_of(other) == "commands" and room_of(module) != "commands" and module != ENTRY
             and module.split(".")[0] not in TEST_SUPPORT]
    assert found == []


def test_a_room_import_going_up_is_found():
    graph = {"bench.store.a": {"bench.run.b"}, "bench.run.b": {"bench.store.a"}, "bench.reports.c": {"bench.run.b"},
             "bench.commands.d": {"bench.run.b", "bench.reports.c"}}
    assert going_up(graph) == ["bench.reports.c -> bench.run.b", "bench.store.a -> bench.run.b"]


def test_the_packages_are_all_seen():
    assert {"runtime", "presses", "allocators", "workloads", "artifacts", "pretrained", "bench", "serving",
            "testing"} <= set(PACKAGES)


def test_a_package_cycle_is_found():
    graph = {"a.x": {"b.y"}, "b.y": {"c"}, "c": {"a.z"}, "a.z": set(), "d": {"a.x"}}
    assert cycles(package_graph(graph)) == [["a", "b", "c"]]


def test_a_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]

"""The project's modules and the project modules each one imports, read from the source without running it.

One walk of the imports for all that needs it: the code version follows it to the modules that decide a row
(:mod:`bench.store.code_version`), and the import-graph test to every edge between the project's modules
(``tests/test_import_graph.py``). Every import counts, the lazy ones inside functions included.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The project's root: the folder of ``pyproject.toml`` and of every package."""


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """``{module: its file}`` of every module of the project's packages (the folders under ``root`` with an
    ``__init__.py``); a package is named by its ``__init__.py``."""
    files = {}
    for package in sorted(path.parent for path in root.glob("*/__init__.py")):
        for path in package.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def imported_modules(module: str, files: dict[str, Path]) -> set[str]:
    """The modules of ``files`` (:func:`module_files`) that ``module`` imports anywhere in its file, each named as
    precisely as the import allows: ``from a import b`` is ``a.b`` where that is a module, else ``a``; an import of a
    name below the modules (``a.attribute``) is the module it is in. A module's own packages and itself are included
    where an import names them: whether they count is the caller's to say."""
    path = files[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            anchor = package[: len(package) - node.level + 1] if node.level else []
            base = ".".join(anchor + ([node.module] if node.module else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in files:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def packages_of(module: str) -> list[str]:
    """``module``'s packages, outermost first, then ``module``: importing it runs each of their ``__init__.py``."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]

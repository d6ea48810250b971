"""The code version a row carries: a hash of the project modules whose code decides its values.

Rows of one code version are compared and averaged together; an edit of any module that decides a value starts a
new version, so that no report mixes rows of two codes. Comments, docstrings and formatting are not hashed: editing
them keeps every store.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

from . import project_modules
from .project_modules import imported_modules, module_files, packages_of

RESULT_ENTRIES = ("bench.harness", "bench.context_run", "bench.rows", "bench.settings")
"""Where a row's values are made. :func:`code_version` hashes every module of the project these import, directly or
through others (imports inside functions too), so a new module of the runtime or a press is covered by itself."""
NOT_RESULT_CODE = ("bench.store", "bench.row_fields", "bench.row_checks", "bench.legacy_rows", "bench.code_version",
                   "artifacts.files")
"""Imported by the entries (or liable to be) but not deciding a value: the store and what it was split into (it
reads, checks and writes rows and names their fields; this module hashes them) and artifacts.files (it writes files
atomically). Editing them keeps stores."""
ENGINE_PACKAGES = {"hf": (), "vllm": ("serving",)}
"""Packages only one engine's rows run, hashed whole into its rows (vLLM loads the plugin's worker by name, not by an
import) and never into another engine's: the serving plugin is not hashed into the runtime's (``hf``) rows."""


def result_modules(engine: str = "hf") -> list[str]:
    """The project modules whose code decides the rows of ``engine``: those :data:`RESULT_ENTRIES` import, directly
    or through others, with the packages of each (their ``__init__.py`` runs too), less :data:`NOT_RESULT_CODE` and
    the packages of the other engines (:data:`ENGINE_PACKAGES`)."""
    # read at each call, not bound at import: a test hashes a copy of the project by pointing ROOT at it
    files = module_files(project_modules.ROOT)
    excluded = {p for other, packages in ENGINE_PACKAGES.items() if other != engine for p in packages}
    own = ENGINE_PACKAGES.get(engine, ())
    seen, todo = set(), [*RESULT_ENTRIES, *sorted(m for m in files if m.split(".")[0] in own)]
    while todo:
        name = todo.pop()
        if name in seen or name in NOT_RESULT_CODE or name.split(".")[0] in excluded:
            continue
        seen.add(name)
        todo.extend(p for imported in imported_modules(name, files) for p in packages_of(imported) if p in files)
    return sorted(seen)


def _normalised_source(path: Path) -> bytes:
    """The module's syntax tree without docstrings: comments, docstrings and formatting do not change it."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(
            getattr(body[0], "value", None), ast.Constant
        ) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree).encode()


def code_version(engine: str = "hf") -> str:
    """Hash of the modules that decide ``engine``'s rows (:func:`result_modules`), docstrings and comments ignored.
    Rows keep the version they were written with (``bench verify`` reads it, never recomputes it)."""
    root = project_modules.ROOT
    files = module_files(root)
    digest = hashlib.sha256()
    for name in result_modules(engine):
        digest.update(files[name].relative_to(root).as_posix().encode())
        digest.update(_normalised_source(files[name]))
    return digest.hexdigest()[:12]

"""The code a row's values depend on, named in two parts: what its setting group shares and what its method owns.

:func:`code_version` hashes the project modules every row of a setting group runs (the runtime, the tasks, the
harness and row making, the selection and the budget machinery): rows of one such version are compared and averaged
together, and an edit of one of them starts a new group. :func:`method_code` hashes what one method runs on top of
that: its press's and its allocator's own code (the modules of their classes and what those import that the group
does not share), for the project's methods and a user's alike. So an edited or added press re-versions only its own
rows, and one new method can join a published group by running its own rows. Comments, docstrings and formatting are
not hashed: editing them keeps every store.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import sys
import sysconfig
from importlib.machinery import BYTECODE_SUFFIXES, EXTENSION_SUFFIXES, ModuleSpec, PathFinder
from pathlib import Path

from presses.score_check import press_label
from pretrained.loading import files_fingerprint
from runtime.errors import UsageError, check_regular_file
from runtime.user_code import run_users

from . import project_modules
from .project_modules import imported_modules, module_files, packages_of

RESULT_ENTRIES = ("bench.run.harness", "bench.run.context_run", "bench.run.rows", "bench.run.settings")
"""Where a row's values are made. :func:`code_version` hashes every module of the project these import, directly or
through others (imports inside functions too), so a new module of the runtime is covered by itself."""
NOT_RESULT_CODE = ("bench.store", "artifacts")
"""Imported by the entries (or liable to be) but not deciding a value, each a module or a package with every module
under it: the store (:mod:`bench.store`: it reads, checks and writes rows, and hashes the code that made them) and
:mod:`artifacts` (it writes files and decides where a command may write them). Editing them keeps stores."""
RESULT_DATA = ("workloads/haystacks/*.jsonl.gz",)
"""Data files of the project that decide values, hashed (their bytes) into every group's code: the real-text
haystack snapshots (a rebuilt snapshot gives other contexts)."""
REGISTRIES = ("presses.registry", "allocators")
"""The modules that list the project's presses and allocators by name. What they import is followed (the group
shares it unless it is a method's own), but they are not hashed: adding a press edits its registry, and a method's
code is its class's (:func:`method_code`), not the list it is named in."""
ENGINE_PACKAGES = {"hf": (), "vllm": ("serving",)}
"""Packages only one engine's rows run, hashed whole into its rows (vLLM loads the plugin's worker by name, not by an
import) and never into another engine's: the serving plugin is not hashed into the runtime's (``hf``) rows."""


def _method_modules(files: dict[str, Path]) -> set[str]:
    """The project modules that define a registered press or allocator: each is its method's own code, and where
    the group's walk reaches one it stops."""
    import allocators
    from presses import registry

    classes = [*registry.PRESSES.values(), *allocators.ALLOCATORS.values()]
    return {cls.__module__ for cls in classes if cls.__module__ in files}


def _walk(start: list[str], files: dict[str, Path], skip: set[str], imports=imported_modules) -> set[str]:
    """Every module of ``files`` that ``start`` imports (as ``imports(module, files)`` reads it), directly or through
    others, with their packages, never entering ``skip``."""
    seen, todo = set(), list(start)
    while todo:
        name = todo.pop()
        if name in seen or name in skip:
            continue
        seen.add(name)
        todo.extend(p for imported in imports(name, files) for p in packages_of(imported) if p in files)
    return seen


def _skipped(engine: str, files: dict[str, Path]) -> set[str]:
    """What neither the group's code nor a method's holds: the store's modules and the other engines' packages."""
    excluded = {p for other, packages in ENGINE_PACKAGES.items() if other != engine for p in packages}
    return {*NOT_RESULT_CODE, *(m for m in files if m.split(".")[0] in excluded or any(
        m.startswith(f"{name}.") for name in NOT_RESULT_CODE))}


def result_modules(engine: str = "hf") -> list[str]:
    """The project modules whose code every row of ``engine`` runs: those :data:`RESULT_ENTRIES` import, directly or
    through others, with the packages of each (their ``__init__.py`` runs too), less :data:`NOT_RESULT_CODE`, the
    packages of the other engines (:data:`ENGINE_PACKAGES`), the registries (:data:`REGISTRIES`) and the modules of
    the registered presses and allocators with what only they import (each method's own: :func:`method_code`)."""
    # read at each call, not bound at import: a test hashes a copy of the project by pointing ROOT at it
    files = module_files(project_modules.ROOT)
    own = ENGINE_PACKAGES.get(engine, ())
    start = [*RESULT_ENTRIES, *sorted(m for m in files if m.split(".")[0] in own)]
    reached = _walk(start, files, _skipped(engine, files) | _method_modules(files))
    return sorted(reached - set(REGISTRIES))


def _normalised_source(path: Path) -> bytes:
    """The module's syntax tree without docstrings: comments, docstrings and formatting do not change it."""
    return _normalised(path.read_text())


def _normalised(source: str) -> bytes:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(
            getattr(body[0], "value", None), ast.Constant
        ) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree).encode()


def _digest(modules: list[str], files: dict[str, Path]) -> hashlib._Hash:
    digest = hashlib.sha256()
    for name in modules:
        digest.update(files[name].relative_to(project_modules.ROOT).as_posix().encode())
        digest.update(_normalised_source(files[name]))
    return digest


def data_digest(root: Path) -> bytes:
    """SHA-256 of the :data:`RESULT_DATA` files under ``root``, each with its path; one that is no regular file (a
    pipe or a device, read for ever) is a :class:`~runtime.errors.UsageError` naming it."""
    digest = hashlib.sha256()
    for pattern in RESULT_DATA:
        for path in sorted(root.glob(pattern)):
            check_regular_file(path, "a data file of the project")
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.digest()


def code_version(engine: str = "hf") -> str:
    """Hash of the modules every row of ``engine`` runs (:func:`result_modules`), docstrings and comments ignored,
    and of the project's data files that decide values (:func:`data_digest`): the shared code of a setting group.
    Rows keep the version they were written with (``bench verify`` reads it, never recomputes it)."""
    files = module_files(project_modules.ROOT)
    digest = _digest(result_modules(engine), files)
    digest.update(data_digest(Path(project_modules.ROOT)))
    return digest.hexdigest()[:12]


INSTALLATION = tuple(Path(sysconfig.get_paths()[key]).resolve() for key in ("stdlib", "platstdlib"))
"""The standard library's folders: with every ``site-packages`` and ``dist-packages`` folder, the Python
installation, whose modules a user's press imports without making them its own code (:class:`_UserModules`)."""


def _installed(path: Path) -> bool:
    """Whether the file ``path`` (resolved) is the Python installation's: the standard library's, or an installed
    package's (under a ``site-packages`` or ``dist-packages`` folder)."""
    return bool({"site-packages", "dist-packages"} & set(path.parts)) or any(
        path.is_relative_to(folder) for folder in INSTALLATION)


def _spec_of(name: str) -> ModuleSpec | None:
    """Where the module ``name`` is: the loaded module's spec, else the one the import system would find, found
    without importing anything (a parent package's folders as it is found, not run), so that an import inside a
    function counts whether or not it has run yet."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        return getattr(loaded, "__spec__", None)
    parent = name.rpartition(".")[0]
    search = None
    if parent:
        spec = _spec_of(parent)
        search = spec.submodule_search_locations if spec is not None else None
        if not search:
            return None
    return PathFinder.find_spec(name, search)


COMPILED = (*BYTECODE_SUFFIXES, *EXTENSION_SUFFIXES)
"""How the file of a module without source ends: a sourceless ``.pyc``, a compiled extension (``.so``, ``.pyd``)."""


class _UserModules(dict):
    """``{module: its file}`` of a user's own modules, each found as a walk of the imports asks for it (``name in
    modules``, as :func:`bench.store.project_modules.imported_modules` and :func:`_walk` ask): a module whose file
    (its source, or a compiled file where it has none: :data:`COMPILED`) lies outside the Python installation
    (:func:`_installed`), or is of the press's own top-level ``package`` wherever that is installed, and outside the
    project's modules (``project``: the group's code or a method's, hashed as such). A source file that does not
    parse is none: it never ran."""

    def __init__(self, project: dict[str, Path], package: str):
        super().__init__()
        self._project = {path.resolve() for path in project.values()}
        self._package = package
        self._others: set[str] = set()

    def __contains__(self, name) -> bool:
        if dict.__contains__(self, name):
            return True
        if name in self._others:
            return False
        spec = _spec_of(name)
        origin = spec.origin if spec is not None and spec.has_location else None
        path = Path(origin).resolve() if isinstance(origin, str) and origin.endswith((".py", *COMPILED)) else None
        # an installed press's own package is its code (probe 15: an entry point's helpers were left out, so an
        # upgrade that changed one pooled rows); another installed package, torch say, is not
        others = path is None or path in self._project or (
            _installed(path) and name.partition(".")[0] != self._package)
        if others or not (_parses(path) if path.suffix == ".py" else path.is_file()):
            self._others.add(name)
            return False
        self[name] = path
        return True


def _user_imports(name: str, files: _UserModules) -> set[str]:
    """The user's modules that ``name`` imports, by an import statement or by name (:func:`_imported_by_name`): none
    where it is compiled, whose imports no source shows."""
    if files[name].suffix != ".py":
        return set()
    return imported_modules(name, files) | _imported_by_name(name, files)


BY_NAME = {"import_module": ("name", "package"), "__import__": ("name", "globals", "locals", "fromlist", "level")}
"""The calls that import a module by its name at run time, ``importlib.import_module`` (called so, or as
``import_module``) and the built-in ``__import__``, with their parameters in order."""


def _imported_by_name(name: str, files: dict[str, Path]) -> set[str]:
    """The modules of ``files`` that ``name`` imports by a call of :data:`BY_NAME` whose module is written out: a
    constant, relative to a constant ``package=`` (``__package__`` too) or ``level=``. A plugin loaded so was left
    out of its press's code, and two versions of it pooled their rows (probe 16, #4); a name made at run time is not
    seen (docs/bench.md says so)."""
    path = files[name]
    own_package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    # probe 17: `from importlib import import_module as load`, and a name kept in a module-level constant
    called_as = {alias.asname or alias.name: alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 and node.module == "importlib" for alias in node.names if alias.name == "import_module"}
    constants = {node.targets[0].id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                 and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                 and isinstance(node.value, ast.Constant)}
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        called = called_as.get(called, called)
        if called not in BY_NAME:
            continue
        given = dict(zip(BY_NAME[called], node.args)) | {k.arg: k.value for k in node.keywords if k.arg}
        module = _written(given.get("name"), own_package, constants)
        if called == "__import__":  # relative by its level (0, absolute, unless given), to the caller's package
            level = _written(given.get("level"), own_package, constants, int) if "level" in given else 0
            anchor = own_package
            module = "." * level + module if level is not None and module is not None else None
        else:
            anchor = _written(given.get("package"), own_package, constants)
        try:
            module = importlib.util.resolve_name(module, anchor) if module is not None else None
        except (ImportError, ValueError):  # no package to be relative to, or beyond its top: it fails as it runs
            module = None
        while module and module not in files:
            module = module.rpartition(".")[0]
        if module:
            found.add(module)
    return found


def _written(node: ast.expr | None, own_package: str, constants: dict, kind: type = str):
    """What ``node``, an argument of a call, is where its source writes it out as a ``kind``: a constant's value (or
    that of a name a module-level assignment binds to one, ``constants``), or the calling module's package for
    ``__package__``; None otherwise."""
    if isinstance(node, ast.Name) and node.id in constants:
        node = ast.Constant(constants[node.id])
    if isinstance(node, ast.Constant):
        return node.value if type(node.value) is kind else None
    return own_package if kind is str and isinstance(node, ast.Name) and node.id == "__package__" else None


def _helper_code(name: str, path: Path) -> bytes:
    """What a helper module adds to its press's code: its source's syntax tree, or, where it is a compiled file, that
    named as such and its bytes' digest (probe 15: a sourceless ``.pyc`` helper was skipped)."""
    if path.suffix == ".py":
        return f"\n{name}\n".encode() + _normalised_source(path)
    return f"\n{name} compiled {path.name} sha256 {hashlib.sha256(path.read_bytes()).hexdigest()}\n".encode()


def _parses(path: Path) -> bool:
    try:
        ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):  # unreadable, not Python, or undecodable (a UnicodeDecodeError)
        return False
    return True


def _own_code(cls: type, engine: str, files: dict[str, Path], shared: set[str], helpers: bool = True) -> bytes:
    """What ``cls``'s rows run beyond the group's code: for a project class, its module and every project module it
    imports that the group does not share (another press's module included); for a class of a user's module, that
    module's whole source (the file it was loaded from; the class's own source where there is no file) and the
    source of each of the user's own modules it imports (or loads by a name written out: :func:`_imported_by_name`),
    directly or through others (:class:`_UserModules`: a helper module beside it or one of the press's own package
    however it is installed, not the standard library, another installed package or the project; a compiled one by
    its bytes, :func:`_helper_code`, its own imports unread), so that an edit of a helper is a new version of the
    press too (probe 14). Not with ``helpers`` false: a class a press names as its own code
    (:meth:`presses.Press.code_objects`) comes with its package's version, which stands for the rest of it however
    that package is installed."""
    module = cls.__module__
    if module in files:
        owned = _walk([module], files, shared | _skipped(engine, files) | set(REGISTRIES))
        return _digest(sorted(owned), files).digest()
    loaded = sys.modules.get(module)
    path = getattr(loaded, "__file__", None)
    try:
        source = Path(path).read_text() if path and path.endswith(".py") else inspect.getsource(cls)
    except (OSError, TypeError):
        source = None
    if source is None:
        raise UsageError(f"{cls.__qualname__} (module {module}): its source cannot be read, so its rows could not "
                         "name its code; define it in a module file and import that")
    code = f"{module}.{cls.__qualname__}\n".encode() + _normalised(source)
    if not (helpers and path and path.endswith(".py")):
        return code
    user = _UserModules(files, module.partition(".")[0])
    user[module] = Path(path)
    for helper in sorted(_walk([module], user, set(), _user_imports) - {module}):  # none: the code as before helpers
        code += _helper_code(helper, user[helper])
    return code


def method_codes(methods: list[tuple], engine: str = "hf", model_dir: Path | None = None) -> list[str]:
    """The method code of each ``(press, allocator)`` of ``methods`` (built objects): :func:`class_method_codes` of
    their classes, the outside code the press names as its own (:meth:`presses.Press.code_objects`: a wrapped kvpress
    scorer's class; a user's press failing there is one line) and the allocator's
    :attr:`~allocators.Allocator.model_files`."""
    return class_method_codes([(type(press), type(allocator), run_users(
        press.code_objects, type(press), f"press {press_label(press)}", "in code_objects"), getattr(
        allocator, "model_files", ())) for press, allocator in methods], engine, model_dir)


def class_method_codes(methods: list[tuple], engine: str = "hf", model_dir: Path | None = None) -> list[str]:
    """The method code of each ``(press class, allocator class, code objects, model files)`` of ``methods``, what it
    runs beyond its group's code (:func:`code_version`): the two classes' own code, the code objects' (with their
    package's version) and ``model_dir``'s files the allocator reads (globs; not where ``model_dir`` is None). Of
    classes, so that a carry's record is checked without building methods (:mod:`bench.store.carried_checks`)."""
    files = module_files(project_modules.ROOT)
    shared = set(result_modules(engine))
    codes = []
    for press, allocator, objects, owned in methods:
        digest = hashlib.sha256()
        for cls in (press, allocator):
            digest.update(_own_code(cls, engine, files, shared))
        for obj in objects:
            cls = obj if isinstance(obj, type) else type(obj)
            root = sys.modules.get(cls.__module__.partition(".")[0])
            digest.update(f"{getattr(root, '__version__', '')}\n".encode())
            digest.update(_own_code(cls, engine, files, shared, helpers=False))
        if owned and model_dir is not None:
            digest.update(files_fingerprint(model_dir, owned).encode())
        codes.append(digest.hexdigest()[:12])
    return codes

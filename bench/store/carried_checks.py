"""The checks of a collection's records of carried groups against the rows they carry (probe 17, #5).

A record (:mod:`bench.store.carried_codes`) makes every reader read a group's rows of one code at another, so what it
says is checked where rows can show it: a record that carries no row of a store it names names a code no row of that
store holds (it was edited, or a record before it removed: the chain stops there), a context it names that its rows
lack was never rerun, and, where it carried the group to this checkout's code, each method's code after it is this
checkout's code of that method. Its form, every reader checks as it reads it
(:func:`~bench.store.carried_codes.read_records`).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from pretrained import CHECKPOINTS, installed
from pretrained.file_record import CHECKOUT
from pretrained.fingerprints import identity
from runtime.errors import UsageError

from .carried_codes import CARRIED, REMEDY, read_records
from .code_version import class_method_codes, code_version
from .collection import collection_stores
from .row_fields import BASELINE, CARRIED_FROM, method_of

SHIPPED_DEFAULT = CHECKOUT / "models" / "hybrid-byte-12l"
"""The shipped default model (``models/hybrid-byte-12l``), whatever ``HYBRIDPRESS_MODEL`` names as the default."""

def check_carried_records(stores: list) -> None:
    """``UsageError`` naming, by its file and index, the first record of the carried groups of a collection's group
    folder among ``stores`` (:class:`~bench.store.result_store.ResultStore`) that names the group's ``none`` store,
    among them, but carried none of its rows (:attr:`~bench.store.result_store.ResultStore.carried`), or names a
    context as rerun that those rows lack (the ``none`` store holds every context's no-prune row); a row whose chain
    of records stops before the last record that names its store (:func:`check_chain`); or a record whose method
    codes are not this checkout's (:func:`check_method_codes`). Not that a record carried a row of each store it
    names: a method rerun since replaced its store's rows (the default model's ``head_shares`` stores), nor that it
    carried ``rows`` rows: a carry that folds copies rewrites a store, and publish adds rows at its code."""
    groups: dict[Path, dict[str, object]] = defaultdict(dict)
    for store in collection_stores(stores):
        groups[store.directory.parent][store.directory.name] = store
    here: dict[str, str] = {}  # this checkout's code of each engine, computed once it is needed
    for folder, held in groups.items():
        path = folder / CARRIED
        records = read_records(path)
        for index, record in enumerate(records):
            where = f"{path}: record {index} (carried from code {record['from']} to {record['to']})"
            if BASELINE in held and BASELINE in record.get("stores", ()):
                carried = held[BASELINE].carried[index]
                if not carried:
                    raise UsageError(f"{where} names the group's none store, {held[BASELINE].path}, but carries none "
                                     f"of its rows: none is of code {record['from']} as the records before it read "
                                     f"them, so it was changed or a record before it removed; {REMEDY}")
                missing = [context for context in record["contexts"] if tuple(context) not in carried]
                if missing:
                    task, item, haystack = missing[0]
                    raise UsageError(f"{where} names the context (task {task}, item {item}, {haystack} haystack) "
                                     f"as rerun, but of the group's no-prune rows it carried ({held[BASELINE].path}) "
                                     f"none is of that context: a carry reruns contexts of its group; {REMEDY}")
            engine = record["group"].get("engine", "hf")
            if engine not in here:
                here[engine] = code_version(engine)
            if record["to"] == here[engine]:
                check_method_codes(record, where)
        for store in held.values():
            check_chain(store, records, path)


def check_chain(store, records: list[dict], path: Path) -> None:
    """``UsageError`` naming, by file and line, a row of ``store`` (a collection's) computed at a ``from`` code of
    ``records`` (its group folder's, the file ``path``) up to the last that names its store, but read at another code
    than that record's ``to``: a carry carries every row of its group not of this checkout's code, so a record after
    the row's last one that names its store and carried the group elsewhere shows a record between them removed or
    changed (probe 17, #5: a middle record dropped, the chain stopped early and verify passed)."""
    last = max((index for index, record in enumerate(records) if store.directory.name in record.get("stores", ())),
               default=None)
    if last is None:
        return
    froms = {record["from"] for record in records[:last + 1]}
    for row, line in zip(store.rows, store.line_numbers):
        if row.get(CARRIED_FROM, row.get("code")) in froms and row.get("code") != records[last]["to"]:
            missing = next((index for index, record in enumerate(records[:last + 1])
                            if store.directory.name in record.get("stores", ())
                            and method_of(row) not in record["method_codes"]), None)
            if missing is not None:  # probe 22, U3: no record before it was removed; this one names no code
                raise UsageError(f"{path}: record {missing} names the store {store.directory.name} but gives its "
                                 f"method {method_of(row)} no code ({store.path}:{line} is of it): a carry names "
                                 f"the code of each method it reran; {REMEDY}")
            raise UsageError(f"{store.path}:{line}: a row computed at code {row.get(CARRIED_FROM, row.get('code'))} "
                             f"reads at code {row.get('code')} under {path}, whose record {last}, the last that names "
                             f"its store, carried the group to code {records[last]['to']}: a record before it was "
                             f"removed or changed (the rows it carries stop at the code of the one before); {REMEDY}")


def check_method_codes(record: dict, where: str) -> None:
    """``UsageError`` naming (``where``: the record) the first method of ``record``, a record that carried its group
    to this checkout's code, whose code after it (``method_codes``) is not this checkout's code of that method
    (:func:`~bench.store.code_version.class_method_codes`, of its classes). A method whose press or allocator is not
    registered here (a user's: verify imports none) is not checked, nor one whose allocator reads files of the model
    (:attr:`~allocators.Allocator.model_files`) where the group's model is not here: the shipped default model's
    folder, or a catalogued checkpoint converted in the cache, of the group's weights."""
    methods = {label: _classes(label) for label in record["method_codes"] if label != BASELINE}
    methods = {label: classes for label, classes in methods.items() if classes is not None}
    model_dir = group_model_dir(record["group"]) if any(classes[3] for classes in methods.values()) else None
    methods = {label: classes for label, classes in methods.items() if model_dir is not None or not classes[3]}
    engine = record["group"].get("engine", "hf")
    for label, code in zip(methods, class_method_codes(list(methods.values()), engine, model_dir)):
        if record["method_codes"][label] != code:
            raise UsageError(f"{where}: its method_codes gives {label} the code {record['method_codes'][label]}, "
                             f"but this checkout, whose code it carried the group to, gives {label} the code {code}: "
                             f"either a module of its press or allocator changed since that carry (a user's module "
                             f"edited: its rows are then no numbers of this code; rerun it under this code into a "
                             f"store of its own), or the record was changed (a carry names the codes its rerun gave; "
                             f"{REMEDY})")


def _classes(label: str) -> tuple | None:
    """``(press class, allocator class, code objects, model files)`` of the method ``label`` (``press/allocator``,
    each with its options shown) where both are registered here (a ``kvpress:`` scorer too), else None. A press that
    names outside code as its own (:meth:`presses.Press.code_objects`: the kvpress adapter, its scorer's class) is
    built without options to name it; one that cannot be built so is not checked."""
    import allocators
    from presses import Press, registry

    press, _, allocator = label.partition("/")
    press, allocator = press.partition("(")[0], allocator.partition("(")[0]
    cls = allocators.ALLOCATORS.get(allocator)
    if cls is None or not (press in registry.PRESSES or press.startswith(registry.KVPRESS_PREFIX)):
        return None
    files = getattr(cls, "model_files", ())
    if press in registry.PRESSES and registry.PRESSES[press].code_objects is Press.code_objects:
        return registry.PRESSES[press], cls, (), files
    try:
        built = registry.get(press)
    except UsageError:
        return None
    return type(built), cls, tuple(built.code_objects()), files


def group_model_dir(group: dict) -> Path | None:
    """The folder of ``group``'s model here where it holds the group's weights: the shipped default model's, or a
    catalogued checkpoint's converted in the cache (:func:`pretrained.installed`); None otherwise."""
    name = group.get("model")
    try:
        directory = SHIPPED_DEFAULT if name == SHIPPED_DEFAULT.name else (
            installed(CHECKPOINTS[name]) if name in CHECKPOINTS else None)
        if directory is None or not (directory / "config.json").is_file():
            return None
        return directory if identity(directory).weights == group.get("weights") else None
    except UsageError:  # a damaged folder is not the group's model: its methods' files are not checked
        return None

"""The checks every reader applies to its stores first (``bench verify``, reports, ``bench merge``, a resumed
``bench compare``): each store given once, every row valid and a collection's in its own folders, no last line cut
short, the shards of one run of one split (:mod:`bench.store.shards`), whole runs (:mod:`bench.store.completeness`)
and one value per row key (:mod:`bench.store.copies`)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from pretrained import CHECKPOINTS
from pretrained.fingerprints import identity
from runtime.errors import UsageError

from .carried_checks import SHIPPED_DEFAULT, check_carried_records
from .carried_codes import CARRIED
from .collection import PACK, STORE_FILES, case_twins, collection_stores, misplaced, older_named
from .completeness import RERUN, SHOWN, check_complete, listed
from .context_identity import check_one_context
from .copies import check_one_value
from .method_identity import check_one_method_code
from .own_artifacts import check_own_artifacts
from .result_store import ResultStore
from .row_fields import BASELINE, CARRIED_FROM, method_of
from .row_set_checks import measured_problems, question_of
from .shards import check_one_split


def check_stores(stores: list[ResultStore], complete: bool = True, source: bool = False) -> None:
    """What ``bench verify`` checks before anything reports on ``stores``, as one ``UsageError``: each store given
    once; every line a valid row (:meth:`~bench.store.result_store.ResultStore.check_rows`); a collection's rows in
    their own folders, under one name a model (:func:`check_in_own_folders`, :func:`check_one_name`), no catalogued
    name the shipped default model's (:func:`check_not_renamed_default`); one method code
    per method and group (:func:`check_methods_alike`); one text a context
    (:func:`~bench.store.context_identity.check_one_context`); a collection's records of carried groups against the
    rows they carry (:func:`~bench.store.carried_checks.check_carried_records`); no label naming its model's own
    artifact (:func:`~bench.store.own_artifacts.check_own_artifacts`); each child against the no-prune row
    of its question in another store (:func:`check_measured_across`), a collection's in its group's ``none`` store
    (:func:`check_group_baselines`); with ``complete``, no last line cut short, the shards
    of one run and split only (:func:`check_one_split`, as ``bench merge`` checks them) and whole runs
    (:func:`check_complete`); and one value per row key, held once (:func:`check_one_value`). With ``source``
    (``bench merge``'s check of each store it joins): the contexts of the shards held alone, and a key held twice
    with one value let through (the merge keeps one copy)."""
    check_given_once(stores)
    for store in stores:
        store.check_rows()
    check_in_own_folders(stores)
    check_one_name(stores)
    check_not_renamed_default(stores)
    check_methods_alike(stores)
    check_one_context(stores)
    check_carried_records(stores)
    check_own_artifacts(stores)
    check_group_baselines(stores)
    check_measured_across(stores)
    if complete:
        check_not_cut(stores)
        check_one_split(stores)
        check_complete(stores, every_shard=not source)
    check_one_value(stores, copies=source)


def check_measured_across(stores: list[ResultStore]) -> None:
    """``UsageError`` naming, by file and line, a child that does not match the no-prune row of its question that
    another store holds (:func:`~bench.store.row_set_checks.measured_problems`): each store's own rows are checked
    alone (:meth:`~bench.store.result_store.ResultStore.check_rows`), and a method's store of a collection holds its
    children alone, its group's no-prune rows being in the group's ``none`` store (probe 14: a child's ΔNLL set to 0
    by hand there passed, where verify says it checked every one)."""
    if len(stores) < 2:
        return
    rows = [(row, f"{store.path}:{line}") for store in stores for row, line in zip(store.rows, store.line_numbers)]
    problems = measured_problems([row for row, _ in rows], [True] * len(rows), lambda index: rows[index][1])
    if problems:
        shown = "; ".join(f"{rows[index][1]}: {problems[index]}" for index in sorted(problems)[:SHOWN])
        more = f"; … ({len(problems) - SHOWN} more)" if len(problems) > SHOWN else ""
        raise UsageError(f"{len(problems)} row(s) are not valid results: {shown}{more}")


def check_group_baselines(stores: list[ResultStore]) -> None:
    """``UsageError`` naming a setting group of a collection whose method stores among ``stores`` hold a child
    without its no-prune row in the group's ``none`` store: no such store, or one that lacks the row (by the child's
    file and line). A method's store of a collection holds its children alone, so it is exempt from holding their
    no-prune rows (:mod:`bench.store.completeness`) only where its group's ``none`` store holds them (probe 16: a
    group whose ``none`` store was deleted passed with its children's ΔNLL edited, and a method's store published
    alone into a new collection made a group of no baseline). A group's ``none`` store not among ``stores`` (a
    method's store given alone, as ``bench merge`` checks each) is read from beside it, and its children are held to
    it (:func:`check_measured_across`)."""
    given = {store.directory.resolve(): store for store in stores}
    groups: dict[Path, list[ResultStore]] = defaultdict(list)
    for store in collection_stores(stores):
        if store.directory.name != BASELINE:
            groups[store.directory.parent].append(store)
    for group, held in groups.items():
        folder = group / BASELINE
        baseline = given.get(folder.resolve())
        beside = baseline is None  # read from beside the stores given, not among them
        if beside:
            if not any((folder / name).is_file() for name in STORE_FILES):
                methods = sorted({method_of(row) for store in held for row in store.rows})
                raise UsageError(f"{group}: the setting group of the collection {group.parent} holds the children of "
                                 f"{listed(methods)} but no none store ({folder / PACK}), whose no-prune rows every "
                                 f"child's ΔNLL and KL are measured against; restore {folder} from version control, "
                                 "or publish the store that holds them with its children (a collection's method "
                                 "store holds its children alone: publish its group's none store with it)")
            baseline = ResultStore(folder, readonly=True)
            baseline.check_rows()
        fulls = {question_of(row) for row in baseline.rows if row["press"] == BASELINE}
        for store in held:
            for row, line in zip(store.rows, store.line_numbers):
                if question_of(row) not in fulls:
                    raise UsageError(f"{store.path}:{line}: a child of {method_of(row)} whose no-prune row (task "
                                     f"{row['task']}, item {row['item']}, question {row['question']}, code "
                                     f"{row.get('code')}) {baseline.path} does not hold, against which its ΔNLL and "
                                     f"KL were measured; {_restore_baseline(row, baseline, held, group)}")
        if beside:  # a none store given is held to its children with the others (check_stores)
            check_measured_across([baseline, *held])


def _restore_baseline(child: dict, baseline: ResultStore, held: list[ResultStore], group: Path) -> str:
    """What to restore where the ``baseline`` store (a collection's group's ``none`` store) lacks the no-prune row of
    ``child``, a row of one of ``held``: the group's record of its carries (:data:`CARRIED`) where that store holds
    the row at another code, or the child says it was carried, or rows do and the record is gone (probe 17, U2: with
    the record deleted, an intact none store was named); else the none store."""
    record = group / CARRIED
    other = next((row.get("code") for row in baseline.rows if row["press"] == BASELINE
                  and question_of(row, ("code",)) == question_of(child, ("code",))), None)
    said = CARRIED_FROM in child or (not record.exists() and any(
        CARRIED_FROM in row for store in (baseline, *held) for row in store.rows))
    if other is None and not said:
        return (f"restore {group / BASELINE} from version control, or publish the run that holds it with its "
                "children")
    elsewhere = f"the none store holds it at code {other}, and " if other is not None else ""
    if not record.exists():
        return (f"{elsewhere}the group's record of its carries, {record}, under which its rows read at the code they "
                f"were carried to, is missing: restore {record} from version control")
    return (f"{elsewhere}the group's record of its carries, {record}, does not carry the two to one code: restore it "
            "from version control (or, where the child's store was put there by hand after a carry, move it out, "
            "carry it and publish it)")


def check_methods_alike(stores: list[ResultStore]) -> None:
    """``UsageError`` naming (by file and line) two rows of one method and setting group that ``stores`` hold
    together computed by two versions of its own code (:func:`check_one_method_code`)."""
    rows = [(row, f"{store.path}:{line}") for store in stores for row, line in zip(store.rows, store.line_numbers)]
    check_one_method_code([row for row, _ in rows], lambda index: rows[index][1])


def check_given_once(stores: list[ResultStore]) -> None:
    """``UsageError`` naming a store directory given twice (its rows would count twice)."""
    given: set[Path] = set()
    for store in stores:
        if store.directory.resolve() in given:
            raise UsageError(f"{store.directory} is given twice; give each store once")
        given.add(store.directory.resolve())


def check_not_cut(stores: list[ResultStore]) -> None:
    """``UsageError`` naming a store whose last line is cut short (its run was killed while writing it)."""
    for store in stores:
        if store.cut_line is not None:
            raise UsageError(f"{store.path}: line {store.cut_line}, the last, is cut short: {RERUN}")


def check_one_name(stores: list[ResultStore]) -> None:
    """``UsageError`` naming, by file and line, a row of a collection's store that names its model otherwise than most
    rows of the collection's stores with its ``weights`` do (the first of them in a tie): one fingerprint covers a
    model's weight files, config and tokenizer, so it is one model, which a collection publishes under one name (probe
    13: a store whose every row's model was renamed smollm2-135m-instruct was published as a section of that name,
    with the default model's weights and rows). Stores of one's own may hold a model under two names (a run before it
    was renamed)."""
    named: dict[str, dict[str, list]] = {}  # weights -> model name -> [rows, where its first row is]
    rows = [(row, f"{store.path}:{line}") for store in collection_stores(stores)
            for row, line in zip(store.rows, store.line_numbers)]
    for row, where in rows:
        named.setdefault(row["weights"], {}).setdefault(row["model"], [0, where])[0] += 1
    for row, where in rows:
        names = named[row["weights"]]
        name = max(names, key=lambda model: names[model][0])  # the first of the most named, in a tie
        if row["model"] != name:
            raise UsageError(f"{where}: model={row['model']!r} (expected {name!r}, as {names[name][0]} row(s) of the "
                             f"collection from {names[name][1]} on name the model of weights {row['weights']}: one "
                             "fingerprint of weights, config and tokenizer is one model, published under one name; a "
                             f"row's model was changed after it ran, or the model ran under another name: rerun it "
                             f"as {name!r})")


def check_not_renamed_default(stores: list[ResultStore]) -> None:
    """``UsageError`` naming, by file and line, a row that names a catalogued model (:data:`pretrained.CHECKPOINTS`)
    with the fingerprint of the shipped default model (:data:`SHIPPED_DEFAULT`): one fingerprint covers weights,
    config and tokenizer, so such a row's model was renamed after it ran (probe 14: a plain store renamed
    smollm2-135m-instruct passed verify and was published as a section of that name into a new collection)."""
    named = [(row, f"{store.path}:{line}") for store in stores for row, line in zip(store.rows, store.line_numbers)
             if row["model"] in CHECKPOINTS]
    if not named or not (SHIPPED_DEFAULT / "config.json").is_file():  # an install without the checkout's models
        return
    shipped = identity(SHIPPED_DEFAULT).weights
    for row, where in named:
        if row["weights"] == shipped:
            raise UsageError(f"{where}: model={row['model']!r} (expected {SHIPPED_DEFAULT.name!r}: its weights "
                             f"{shipped} are the shipped default model's, {SHIPPED_DEFAULT}, which is no catalogued "
                             "checkpoint; the row's model was changed after it ran: restore it)")


def check_in_own_folders(stores: list[ResultStore]) -> None:
    """``UsageError`` naming a store of a collection that reads another file than its
    :data:`~bench.store.collection.PACK` (a ``results.jsonl`` a command given the method's folder as its output wrote
    there: ``bench publish`` alone writes a collection's stores, checking the collection whole first, so its rows
    joined the collection unchecked), or naming, by file and line, a row a collection's store holds outside the
    folders of its setting group and method (:func:`bench.store.collection.misplaced`), or, where a bench older than
    this one named that folder after its rows' methods (:func:`bench.store.collection.older_named`), the folder
    each one's rows now lie in; or naming two method folders of a group that differ in letter case alone
    (:func:`bench.store.collection.case_twins`)."""
    twins = case_twins([store.directory for store in collection_stores(stores)])
    if twins is not None:
        raise UsageError(twins)
    for store in collection_stores(stores):
        if store.path.name != PACK:
            raise UsageError(f"{store.path}: a store of the collection {store.directory.parent.parent} reads "
                             f"{store.path.name} (expected {PACK} alone, which bench publish writes): a command given "
                             f"{store.directory} as its output wrote it, and its rows joined the collection "
                             "unchecked; move it to a folder of its own (and restore the folder's pack from version "
                             "control if it changed), then `bench publish FOLDER --into COLLECTION` adds its rows")
        found = misplaced(store.directory, store.rows)
        folders = older_named(store.directory, store.rows) if found is not None else None
        if folders is not None:
            raise UsageError(_older_folder(store.path, folders))
        if found is not None:
            index, own = found
            raise UsageError(f"{store.path}:{store.line_numbers[index]}: a row of {own}, in the store "
                             f"{store.directory.parent.name}/{store.directory.name} of the collection "
                             f"{store.directory.parent.parent} (expected its group's and method's folder, named after "
                             "its model, length and settings: one of them was changed after it was published); "
                             "restore the file from version control")


def _older_folder(path: Path, folders: dict[str, str]) -> str:
    """The message of a collection's store at ``path`` whose folder a bench older than this one named after the
    methods whose rows it holds, each of ``folders`` (``{label: its folder now}``): rename it, or split it."""
    store = path.parent
    if len(folders) == 1:
        [(label, folder)] = folders.items()
        return (f"{path}: the folder {store.name} holds the rows of {label}, and is named as a bench older than this "
                f"one named that method's folder, now {folder} (one folder a label): rename it, "
                f"`mv {store} {store.parent / folder}`")
    moves = ", ".join(f"{label} into {folder}" for label, folder in folders.items())
    return (f"{path}: the folder {store.name} holds the rows of {' and '.join(folders)}, and is named as a bench "
            "older than this one named their folders, each of its own now (one folder a label): move each one's rows "
            f"into its own folder in {store.parent}, {moves}")

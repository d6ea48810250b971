"""``bench carry``: a setting group carried across a code change that does not change its numbers.

A group's rows name the code they ran (:func:`bench.store.code_version.code_version`, and each method's own,
:func:`bench.store.code_version.method_codes`); once that code is edited, a new method's rows are of another group and
cannot be compared with them. Carrying reruns a seeded sample of the group's contexts, every method at every kept
fraction in the order its rows were written (so that each padded batch holds what it held), under this checkout's
code, into a scratch store. Where every value of every row equals the stored one (timings aside; real numbers to
float32's last digits, :data:`RELATIVE_TOLERANCE`), the group's rows
name this code from then on, each keeping the code it was computed by (``carried_from``), and the check is recorded
in ``carried.json`` (which contexts, which codes, which library versions). In a collection (``docs/results``, or one
group's folder of it) the files stay as they are and the group folder's record names the code their rows read under
(:mod:`bench.store.carried_codes`): a carry adds a record to history, not every row again. A store outside a
collection is rewritten. The first value that differs refuses the carry, naming it and its method: such a group must
be rerun.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

from artifacts.files import atomic_path
from artifacts.output_kinds import GROUP_FOLDER
from pretrained import loading, model_info
from runtime.errors import UsageError
from workloads.tasks import registry as tasks

from ..store.carried_codes import CARRIED, read_records
from ..store.code_version import code_version
from ..store.label_read_back import read_back_problem
from ..store.result_store import ResultStore, open_stores
from ..store.row_fields import CARRIED_FROM, CONTEXT_SHA, GROUP_FIELDS, KEY_FIELDS, METHOD_CODE, describe_row, method_of
from ..store.store_checks import check_stores
from .carried_methods import check_registered
from .label_settings import item_value, setting_problem
from .settings import CompareSettings
from .specs import shown_text

NOT_VALUES = {"code", METHOD_CODE, CARRIED_FROM, "prefill_seconds", "score_seconds", "run", "batch", "schema"}
"""Fields a rerun may change without changing a result: the codes, timings, the run and batch a row names."""
RELATIVE_TOLERANCE, ABSOLUTE_TOLERANCE = 1e-5, 1e-4
"""How far a real value of a rerun may lie from the stored one and still be equal: float32 arithmetic on another
CPU or thread count (another BLAS kernel, another summation order) moves an NLL by about 1e-5 of itself, and an NLL
difference (``delta_nll``) by as much in absolute terms, however small the difference (seen: 0.013619 against
0.013629 nats, one thread a worker against two in one process); reports print three decimals. Counts, choices,
texts and flags must be identical."""


def _uncoded_key(row: dict) -> tuple:
    """A row's key without the codes it names: the same row under an earlier code and under this one."""
    return tuple(row.get(f) for f in KEY_FIELDS if f not in ("code", METHOD_CODE))


def _equal(new, old) -> bool:
    """``new == old``, real numbers within the tolerances above (in lists and per-layer dicts too)."""
    if isinstance(new, float) and isinstance(old, (float, int)) and not isinstance(old, bool):
        return math.isclose(new, old, rel_tol=RELATIVE_TOLERANCE, abs_tol=ABSOLUTE_TOLERANCE)
    if isinstance(new, list) and isinstance(old, list):
        return len(new) == len(old) and all(map(_equal, new, old))
    if isinstance(new, dict) and isinstance(old, dict):
        return new.keys() == old.keys() and all(_equal(new[k], old[k]) for k in new)
    return new == old


def _group_of(row: dict) -> tuple:
    return tuple(row.get(field) for field in (*GROUP_FIELDS, "seed"))


def _item(label: str, artifacts: list[Path], patterns_of) -> str:
    """The ``name[key=value,...]`` item whose spec is labelled ``label`` (:mod:`bench.run.specs`): lists back to ``/``,
    an option shown by its files' fingerprint back to the folder of ``artifacts`` that has it, and text as it is
    shown, escapes and all (:func:`bench.run.specs.shown_text`), but for a space at either end, which the item would
    lose as it is read (``%20``)."""
    name, _, shown = label.partition("(")
    if not shown:
        return name
    options = []
    for pair in shown.removesuffix(")").split(","):
        key, _, value = pair.partition("=")
        patterns = patterns_of(name).get(key)
        if patterns is not None:
            found = [d for d in artifacts if loading.files_fingerprint(d, patterns[1]) == value]
            if not found:
                raise UsageError(f"{label}: its {key} is the folder whose files' fingerprint is {value}; give that "
                                 f"folder with --artifacts (given: {', '.join(map(str, artifacts)) or 'none'})")
            value = shown_text(str(found[0]))  # a path as the item's text: a ',' in it splits no pair
        options.append(f"{key}={item_value(value)}")
    return f"{name}[{','.join(options)}]"


def _label_problem(label: str, kind: str) -> str | None:
    """Why ``label`` does not read back as itself, its setting's check asked here too: the bench command hands it to
    every reader, a library caller of carry may not have."""
    return read_back_problem(label, kind) or setting_problem(label, kind)


def _check_read_back(rows: list[dict], where: Path) -> None:
    """Each label of ``rows`` read back as itself (:func:`~bench.store.label_read_back.read_back_problem`), before the
    rows are checked (which names such a row's file and line, but not what a carry of its group does about it): one
    that does not is named with its method and the store ``where`` (probe 16, U1: the refusal named a ``--methods``
    flag the user never gave)."""
    # a label that is no text is the row checks' to name
    methods = ((row.get("press"), row.get("allocator")) for row in rows)
    for press, allocator in dict.fromkeys(m for m in methods if all(isinstance(label, str) for label in m)):
        problem = _label_problem(press, "press") or _label_problem(allocator, "allocator")
        if problem:
            raise UsageError(f"{where}: its group's method {press}/{allocator}: {problem}: rerun that method into a "
                             "store of its own (bench compare --methods, each '%' of its text written %25), and carry "
                             "the rest of the group without these rows (move them out)")


def _check_labels(rows: list[dict], artifacts: list[Path], where: Path) -> None:
    """Each method of ``rows`` read back as the item its rerun will give (:func:`_item`), before any context is rerun:
    an estimator's folder not given is named with the store ``where`` (each label reads back as itself: checked first,
    :func:`_check_read_back`)."""
    for method in dict.fromkeys(method_of(row) for row in rows if row["press"] != "none"):
        press, _, allocator = method.partition("/")
        try:
            _item(press, artifacts, _patterns)
            _item(allocator, artifacts, lambda _: {})
        except UsageError as error:
            raise UsageError(f"{where}: its group's method {method}: {error}") from None


def _patterns(name: str) -> dict:
    import presses

    return presses.PRESSES[name].artifact_files if name in presses.PRESSES else {}


def _model(name: str):
    """The model a group's rows name: a catalogued model or the shipped default, by name."""
    default = loading.resolve(None)
    if Path(default).name == name:
        return None
    try:
        return loading.resolve(name)
    except (UsageError, FileNotFoundError) as error:
        raise UsageError(f"the rows' model {name!r}: {error}; or give its directory with --model") from None


def _rerun(rows: list[dict], context: tuple, model, scratch: Path, batch: int, artifacts: list[Path]) -> list[dict]:
    """The rows of one context rerun under this checkout's code: its methods and fractions in the order its stored
    rows were written (one run, so each padded batch is what it was)."""
    from .compare import run_compare

    task, item, haystack = context
    mine = [r for r in rows if (r["task"], r["item"], r.get("haystack")) == context]
    pairs = list(dict.fromkeys(method_of(r) for r in mine if r["press"] != "none"))
    fractions = list(dict.fromkeys(r["keep_fraction"] for r in mine if r["press"] != "none"))
    first = mine[0]
    # the haystack the context was built on: a task that reads none (vt) ran on the generated text whatever its run's
    # --haystack said, and rerun alone it is given none (a --haystack no task reads is refused)
    named = haystack if tasks.reads_haystack(task) else tasks.GENERATED
    settings = CompareSettings(
        presses=[], allocators=[], pairs=[f"{_item(p.split('/')[0], artifacts, _patterns)}/"
                                          f"{_item(p.split('/')[1], artifacts, lambda _: {})}" for p in pairs],
        keep_fractions=fractions or [1.0], tasks=[task], n=item + 1, shard=(item, item + 1), length=first["length"],
        profile=first["profile"], seed=first["seed"], haystack=named, engine=first.get("engine", "hf"),
        model=model, out=scratch / f"{task}-{item}", batch=batch)
    return run_compare(settings, show_progress=False).rows


def _compare(stored: list[dict], rerun: list[dict], store: Path) -> None:
    """``UsageError`` naming the first stored row of the context that the rerun lacks or gives another value."""
    by_key = {_uncoded_key(r): r for r in rerun}
    for row in stored:
        new = by_key.get(_uncoded_key(row))
        if new is None:
            raise UsageError(f"{store}: the rerun under this checkout's code gave no row of {describe_row(row)}, "
                             f"which the group holds (code {row['code']}): carry it from a checkout of that code")
        if row.get(CONTEXT_SHA, new.get(CONTEXT_SHA)) != new.get(CONTEXT_SHA) or row["n_context"] != new["n_context"]:
            raise UsageError(f"{store}: task {row['task']}, item {row['item']} ({row.get('haystack')} haystack) is "
                             f"another text here ({new['n_context']} tokens, digest {new.get(CONTEXT_SHA)}) than the "
                             f"one the group answered ({row['n_context']} tokens, digest {row.get(CONTEXT_SHA)}): its "
                             "text was built otherwise (a group of real text from before the haystacks were shipped "
                             "snapshots read that machine's own files); rerun the group")
        for field in sorted(set(row) - NOT_VALUES):
            if not _equal(new.get(field), row[field]):
                batch = " (another padded batch: give the --batch the group was run with)" if (
                    row.get("batch") and new.get("batch") != row["batch"]) else ""
                raise UsageError(f"{store}: {field} of {describe_row(row)} is {new.get(field)!r} under this "
                                 f"checkout's code and {row[field]!r} in the store (code {row['code']}){batch}: the "
                                 f"numbers of {method_of(row)} changed, so the group cannot be carried; rerun it under "
                                 "this code into another store")


def carry(directory: Path, sample: int = 2, seed: int = 0, batch: int = 32, model=None,
          artifacts: list[Path] = ()) -> list[dict]:
    """Carry every setting group of the store (or collection of stores, :mod:`bench.store.collection`, or one group's
    folder of a collection) at ``directory`` whose code is not this checkout's (module docstring); returns the
    records written to its ``carried.json``."""
    from ..store.collection import expand, group_stores, is_collection

    group = group_stores(Path(directory))
    if group and not (GROUP_FOLDER.fullmatch(Path(directory).name) and is_collection(Path(directory).parent)):
        raise UsageError(f"{directory} holds stores one folder down ({group[0].name}, …) but is no setting group's "
                         "folder of a collection (as verify reads it): carry each store of it, or publish them into a "
                         "collection and carry that (probe 18: its record named stores no reader reads under it)")
    in_collection = bool(group) or is_collection(Path(directory))
    given = group or [Path(directory)]
    open_stores(given)  # no such folder, a file, no store there, one being written: refused first
    read_records(Path(directory) / CARRIED)  # the record appended to, read before any row is rewritten (probe 18)
    # a writer's lock on each: nothing appends while their rows are rewritten
    stores = [ResultStore(d, named="store") for d in expand(given)]
    try:
        _check_read_back([row for store in stores for row in store.rows], Path(directory))
        check_stores(stores)
        for store in stores:
            if store.path.name == "results.jsonl" and store.path.with_name("results.jsonl.gz").exists():
                raise UsageError(f"{store.directory} holds results.jsonl beside results.jsonl.gz: carry a store of "
                                 "one file (pack it, or carry the uncompressed copy alone)")
        entries = [(store, i) for store in stores for i in range(len(store.rows))]
        here = {engine: code_version(engine) for engine in {s.rows[i].get("engine", "hf") for s, i in entries}}
        groups: dict[tuple, list[tuple]] = {}
        for store, i in entries:
            row = store.rows[i]
            if row.get("code") != here[row.get("engine", "hf")]:
                groups.setdefault(_group_of(row), []).append((store, i))
        # the methods it reruns, and where its records and rewritten rows go, checked before any context is rerun
        rerun_rows = [store.rows[i] for held in groups.values() for store, i in held]
        check_registered(rerun_rows, Path(directory))
        _check_labels(rerun_rows, list(artifacts), Path(directory))
        _check_writable([held[0][0].directory.parent for held in groups.values()] if in_collection else
                        [Path(directory), *(store.directory for held in groups.values() for store, _ in held)])
        # each group's model, found before any context is rerun (bench carry checks --model as compare does)
        models = {group: model if model is not None else _model(held[0][0].rows[held[0][1]]["model"])
                  for group, held in groups.items()}
        if model is not None:
            _check_weights(model, groups, Path(directory))
        records = [_carry_group(group, held, sample, seed, batch, models[group], list(artifacts), directory)
                   for group, held in groups.items()]
        carried = {}
        for held in groups.values():
            for store, i in held:
                carried.setdefault(store, set()).add(i)
        # every copy checked before a file is written; a store that held one is rewritten without it
        folded = [store for store, indices in carried.items() if _fold_copies(store, indices)]
        if in_collection:  # the files stay: each group folder's record names the code its rows read under
            for record, held in zip(records, groups.values()):
                record["stores"] = sorted({store.directory.name for store, _ in held})
                _append_records(held[0][0].directory.parent / CARRIED, [record])
        for store in folded if in_collection else carried:
            _rewrite(store)
        if records and not in_collection:
            _append_records(Path(directory) / CARRIED, records)
        return records
    finally:
        for store in stores:
            store.close()


def _check_weights(model, groups: dict[tuple, list[tuple]], where: Path) -> None:
    """A ``UsageError`` where ``--model``'s weights are not those a group's rows were computed on (probe 17: the
    other model was loaded, every context rerun, and the differing values blamed on the code)."""
    weights = model_info.read(model).identity.weights
    at = GROUP_FIELDS.index("weights")
    for group in groups:
        if group[at] != weights:
            raise UsageError(f"{where}: --model {model} has weights {weights}, but the rows of "
                             f"{group[GROUP_FIELDS.index('model')]} were computed on weights {group[at]}: give the "
                             "model they were computed on (or none, for a catalogued or the default model)")


def _carry_group(group: tuple, held: list[tuple], sample: int, seed: int, batch: int, model, artifacts: list[Path],
                 where: Path) -> dict:
    """Rerun a sample of one group's contexts, compare, and name this code in its rows (in memory); its record."""
    rows = [store.rows[i] for store, i in held]
    contexts = sorted({(r["task"], r["item"], r.get("haystack")) for r in rows}, key=str)
    chosen = sorted(random.Random(seed).sample(contexts, min(sample, len(contexts))), key=str)
    codes: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="carry-") as scratch:
        for number, context in enumerate(chosen, 1):
            print(f"group {dict(zip((*GROUP_FIELDS, 'seed'), group))}: context {number}/{len(chosen)} "
                  f"({context[0]}, item {context[1]})", file=sys.stderr)
            rerun = _rerun(rows, context, model, Path(scratch), batch, artifacts)
            _compare([r for r in rows if (r["task"], r["item"], r.get("haystack")) == context], rerun, where)
            codes.update({method_of(r): r[METHOD_CODE] for r in rerun})
    missing = sorted({method_of(r) for r in rows} - set(codes))
    if missing:  # a method the sample never ran cannot be named by a code of its own
        raise UsageError(f"{where}: the sample ran no row of {', '.join(missing)}; carry with a larger --sample")
    before = {method_of(r): r.get(METHOD_CODE) for r in rows}
    old, new = rows[0]["code"], rerun[0]["code"]
    for store, i in held:
        row = store.rows[i]
        store.rows[i] = {**row, "code": new, METHOD_CODE: codes[method_of(row)],
                         CARRIED_FROM: row.get(CARRIED_FROM, old)}
    return {"group": dict(zip((*GROUP_FIELDS, "seed"), group)), "from": old, "to": new,
            "method_codes_from": before, "method_codes": codes,
            "contexts": [list(c) for c in chosen], "sample": sample, "seed": seed, "rows": len(held),
            "checked": time.strftime("%Y-%m-%d", time.gmtime()), "versions": _versions()}


def _versions() -> dict:
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}


def _check_writable(folders: list[Path]) -> None:
    """A :class:`~runtime.errors.UsageError` naming the first of ``folders`` that cannot be written: a read-only
    group folder ended the run after its contexts were rerun, in a raw "[Errno 1]" (probe 10)."""
    for folder in dict.fromkeys(folders):
        if not os.access(folder, os.W_OK | os.X_OK):
            raise UsageError(f"{folder} is not writable, and carry puts its {CARRIED} or the store's carried rows "
                             "there (each written beside its place and renamed into it): make the folder writable, "
                             "or carry a copy of the store")


def _append_records(path: Path, records: list[dict]) -> None:
    """``records`` appended to the :data:`CARRIED` file ``path`` (written whole, atomically)."""
    with atomic_path(path) as scratch:
        scratch.write_text(json.dumps(read_records(path) + records, indent=1) + "\n")


def _fold_copies(store: ResultStore, carried: set[int]) -> bool:
    """Drop each carried row whose key the store already holds under this code (a run of this code resumed the
    store since and answered it again) where every value is equal (:func:`_equal`); ``UsageError`` naming the first
    that differs. Without this the store would hold one key twice, which verify refuses. Whether it dropped any."""
    native = {_uncoded_key(row): row for i, row in enumerate(store.rows) if i not in carried}
    drop = set()
    for i in sorted(carried):
        row, twin = store.rows[i], native.get(_uncoded_key(store.rows[i]))
        if twin is None:
            continue
        differing = next((f for f in sorted(set(row) - NOT_VALUES) if not _equal(twin.get(f), row[f])), None)
        if differing is not None:
            raise UsageError(f"{store.directory}: {describe_row(row)} is held twice, once by code "
                             f"{row.get('carried_from')} and once by this checkout's, with {differing} "
                             f"{row[differing]!r} against {twin.get(differing)!r}: the group's numbers changed, so it "
                             "cannot be carried; rerun it under this code into another store")
        drop.add(i)
    store.rows = [row for i, row in enumerate(store.rows) if i not in drop]
    return bool(drop)


def _rewrite(store: ResultStore) -> None:
    """The store's file with its carried rows (lines that are not rows dropped), in its own format."""
    data = "".join(json.dumps(row) + "\n" for row in store.rows).encode()
    with atomic_path(store.path) as path:
        path.write_bytes(gzip.compress(data, mtime=0) if store.path.suffix == ".gz" else data)

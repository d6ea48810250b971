"""Whether result stores hold whole runs, and the checks every report applies to its stores first.

Each row names its run (:data:`bench.store.row_fields.RUN`): the run's contexts, in order, and the shard of them it
took. The rows of one setting group (:data:`bench.store.row_fields.SHARED_FIELDS`: model, weights, code version, …) are
whole when every context of every run they name holds rows — every shard of the run, or (``bench merge`` checking one
shard's store) every context of the shards held — and every context holds the rows of every method and question of its
group.

What is missing is named with the lines that lack it: a shard no store holds, the shards of two splits of one run,
or a context a run stopped before. Where the stores hold several groups, the group is named by its lines and by what
sets it apart (another code version, model or settings), with what to do: remove the rows written there by mistake,
or rerun the run that stopped. The smallest group is checked first: a row of another code version is named as such,
not as a hole in the run whose row it replaced.

Rows written before runs were recorded (every committed store) name none: their groups are checked context by
context only.
"""

from __future__ import annotations

import reprlib
from collections import defaultdict
from itertools import islice
from pathlib import Path

from runtime.errors import UsageError
from workloads.tasks.registry import haystack_of

from .code_version import code_version
from .method_identity import check_one_method_code
from .result_store import ResultStore
from .row_fields import (
    BATCH,
    FIDELITY_FIELDS,
    GROUP_FIELDS,
    QUESTIONS,
    RUN,
    SHARED_FIELDS,
    describe_row,
    method_at,
    method_of,
    row_key,
    shard_contexts,
    shards_with_contexts,
    shown_fraction,
)

RERUN = "its bench compare stopped before finishing; rerun it (it resumes)"
RERUN_THOSE = "their bench compare stopped before finishing; rerun it with those settings (it resumes)"
RERUN_NAMED = ("the bench compare that wrote them stopped before finishing, or a later run into this store gave "
               "other methods or fractions: rerun one with the methods and fractions named (it resumes)")
"""The advice for the rows of a group beside others: their run's settings are what set them apart."""
OTHER_CONTEXTS = ("a report compares methods on the same contexts: run the methods with the same --tasks and --n "
                  "into one store (bench compare resumes a store and adds methods to it), or report each store "
                  "alone (bench leaderboard STORE --out DIR, bench verify STORE)")
"""The advice for stores of runs on other contexts pooled in one setting group."""
NOT_WRITTEN = "no run writes such a row: remove its line, or restore the store from its run's own copy"
"""The advice for a row that contradicts its own context (a question past those it has)."""
SHOWN = 5
"""How many missing rows or methods a message lists."""
RUN_SHARED = ("tasks", "n", "haystack", "shards")
"""What the rows of every shard of one run name alike of their run (:data:`bench.store.row_fields.RUN`): all but the
shard."""
Entry = tuple[dict, ResultStore, int]
"""A row, the store that holds it and its line there."""
Gap = tuple[str, str]
"""What a group's rows lack, said after their files (``is incomplete: …``), and what to do about it."""


def check_stores(stores: list[ResultStore], complete: bool = True) -> None:
    """What ``bench verify`` checks before anything reports on ``stores``, as one ``UsageError``: each store given
    once; every row valid (:meth:`~bench.store.result_store.ResultStore.check_rows`); with ``complete``, no last line
    cut short, the shards of one run and split only (:func:`check_one_split`, as ``bench merge`` checks them) and whole
    runs (:func:`check_complete`); and one value per row key, held once (:func:`check_one_value`)."""
    check_given_once(stores)
    for store in stores:
        store.check_rows()
    rows = [(row, f"{store.path}:{line}") for store in stores for row, line in zip(store.rows, store.line_numbers)]
    check_one_method_code([row for row, _ in rows], lambda index: rows[index][1])
    if complete:
        check_not_cut(stores)
        check_one_split(stores)
        check_complete(stores)
    check_one_value(stores)


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


BATCH_TOLERANCE = {"float32": 1e-4, "bfloat16": 0.05, "float16": 0.01}
"""How far the fidelity values (answer_nll, delta_nll, kl) of one row answered in two padded batches may differ,
relative to the larger of 1 and their magnitudes, by the dtype the rows ran in: other shapes sum in another order
(measured in float32: 2e-6 nats at most). Every other value — the prediction, the score, what was kept — is the
same from any batch."""


def row_values(row: dict) -> dict:
    # the timings of one context are measured where it ran, and the run that wrote it is where the row comes from,
    # and the batch that answered it is how it was computed: not values of it, so two copies of a row may differ in
    # them alone
    return {k: v for k, v in row.items() if not k.endswith("_seconds") and k not in (RUN, BATCH)}


def batch_difference(a: dict, b: dict) -> float | None:
    """The largest difference of the fidelity values of two copies of one row answered in other padded batches
    (:data:`~bench.store.row_fields.BATCH`), where that is all they differ in (:data:`BATCH_TOLERANCE`); None otherwise
    — also for rows that do not record their batch, which could have come from one."""
    if a.get(BATCH) is None or b.get(BATCH) is None or a[BATCH] == b[BATCH]:
        return None
    va, vb = row_values(a), row_values(b)
    if {k: v for k, v in va.items() if k not in FIDELITY_FIELDS} != {
            k: v for k, v in vb.items() if k not in FIDELITY_FIELDS}:
        return None
    tolerance = BATCH_TOLERANCE.get(a.get("dtype"), BATCH_TOLERANCE["float32"])
    largest = 0.0
    for field in FIDELITY_FIELDS:
        x, y = va.get(field), vb.get(field)
        if isinstance(x, bool) or isinstance(y, bool) or not (
                isinstance(x, (int, float)) and isinstance(y, (int, float))):
            if x != y:
                return None
            continue
        if abs(x - y) > tolerance * max(1.0, abs(x), abs(y)):
            return None
        largest = max(largest, abs(x - y))
    return largest


def _first_difference(a: dict, b: dict) -> str:
    """The first field two copies of a row hold other values of, as a message shows it."""
    va, vb = row_values(a), row_values(b)
    field = next(k for k in sorted(set(va) | set(vb)) if va.get(k) != vb.get(k))
    return f"{field} {reprlib.repr(va.get(field))} and {reprlib.repr(vb.get(field))}"


def check_one_value(stores: list[ResultStore], copies: bool = False) -> list[float]:
    """``UsageError`` naming (by file and line) the first row key that two rows of ``stores`` hold with other values:
    one key, one value. With ``copies`` False, also a key held twice with the same values, which a report would
    count twice. ``bench merge`` passes True: it keeps the first copy of a key, and two copies may also differ where
    each was answered in another padded batch, in their fidelity values alone and within :data:`BATCH_TOLERANCE`
    (a method held by two runs of other methods); returns the largest difference of each such key."""
    seen: dict[tuple, tuple[dict, str]] = {}
    differences = []
    for store in stores:
        for row, line in zip(store.rows, store.line_numbers):
            key, where = row_key(row), f"{store.path}:{line}"
            if key not in seen:
                seen[key] = (row, where)
                continue
            first, there = seen[key]
            same = row_values(first) == row_values(row)
            difference = None if same else batch_difference(first, row)
            if not same and difference is None:
                batches = " (from two padded batches, which change only the last digits of NLL and KL)" if (
                    first.get(BATCH) is not None and row.get(BATCH) is not None
                    and first[BATCH] != row[BATCH]) else ""
                raise UsageError(f"{there} and {where} hold the row of {describe_row(row)} with other values "
                                 f"({_first_difference(first, row)}){batches}: one key, one value (shards of one run "
                                 "agree on every row they share)")
            if not copies:
                raise UsageError(f"{there} and {where} both hold the row of {describe_row(row)}: a report would count "
                                 "it twice; keep one copy (bench merge joins stores, keeping one)")
            if difference is not None:
                differences.append(difference)
    return differences


def check_one_split(stores: list[ResultStore]) -> None:
    """``UsageError`` naming a store that holds a part of a sharded run (not every shard of it) and another store of
    its setting group that is not a shard of that run and split, or holds other methods (:func:`check_shards_alike`,
    as ``bench merge`` compares them). Together the two may hold every context their runs name — shard 0/2 and shard
    1/3 of a run of two contexts do, and so do shard 0/2 of one press and shard 1/2 of another — but ``bench merge``
    refuses to join them, and a store holds the rows of one split of one run."""
    groups: dict[tuple, dict[ResultStore, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for store in stores:
        for row in store.rows:
            groups[_group_of(row)][store].append(row)
    for held in groups.values():
        part = next((store for store, rows in held.items() if _is_part(rows)), None)
        for other, rows in held.items():
            if part is not None and other is not part:
                check_shards_alike(part, shard_settings(held[part]), other, shard_settings(rows))


def shard_settings(rows: list[dict]) -> dict[str, list[str]]:
    """What the shards of one run share beside their setting group, as ``bench merge`` compares them (in this
    order): the methods (press/allocator at each p) and each field of their run but the shard
    (:func:`run_settings`)."""
    return {"methods": sorted({method_at(row) for row in rows}), **run_settings(rows)}


def run_settings(rows: list[dict]) -> dict[str, list[str]]:
    """``{"run field": its values}`` of each field of the runs ``rows`` name but the shard (:data:`RUN_SHARED`),
    ``–`` for rows that name none."""
    return {f"run {field}": sorted({str(row[RUN][field]) if RUN in row else "–" for row in rows})
            for field in RUN_SHARED}


def check_shards_alike(first: ResultStore, mine: dict[str, list[str]], other: ResultStore,
                       theirs: dict[str, list[str]], other_methods: bool = False) -> None:
    """``UsageError`` naming ``first`` and ``other`` and the first of the settings they hold (``mine`` and
    ``theirs``: ``{setting: its values}``, the same settings in the same order) whose values differ, as stores
    that are not shards of one run: a store that lacks some of the other's methods, stores of two splits of one run
    (``run shards``), or of two runs or settings. With ``other_methods``, two stores that each hold whole runs (not
    parts of sharded ones) may differ in their methods and splits: ``bench merge`` joins runs of other methods on
    the same contexts (the rows both hold must agree: :func:`check_one_value`)."""
    whole = other_methods and not _is_part(first.rows) and not _is_part(other.rows)
    for field, values in mine.items():
        if theirs[field] == values or (whole and field in ("methods", "run shards")):
            continue
        only_mine, only_theirs = set(values) - set(theirs[field]), set(theirs[field]) - set(values)
        if field == "methods" and other_methods and _is_part(first.rows) != _is_part(other.rows):
            raise UsageError(f"{first.path} and {other.path} hold other methods, and "
                             f"{first.path if _is_part(first.rows) else other.path} is one shard of a sharded run: "
                             "merge the shards of each run first (bench merge SHARDS --out RUN), then merge the runs "
                             "(one call joins the shards of one run, or whole runs of other methods, not both, even "
                             "with every shard given)")
        if field == "methods" and not (only_mine and only_theirs):  # one shard holds a part of the other's
            small, large, lacking = (first, other, only_theirs) if not only_mine else (other, first, only_mine)
            raise UsageError(f"{small.path} holds no rows of {listed(sorted(lacking))}, which {large.path} holds: "
                             f"the run of {small.directory} did not finish (rerun it, it resumes), or it ran fewer "
                             "methods and is not a shard of the same run")
        if field == "run shards":
            raise UsageError(f"{first.path} holds shard {_shards_held(first)} and {other.path} shard "
                             f"{_shards_held(other)}: the shards of one run are of one --shard K/N split (one N); "
                             "merge the stores of one split")
        other_contexts = ("; merge joins the shards, or the runs of other methods, of one set of contexts: keep each "
                          "in its own store (bench leaderboard and bench verify read several)"
                          if field in ("seed", "length", "profile") else
                          "; rows of two code versions are two results, reported apart: keep each in its own store "
                          "(bench leaderboard and bench verify read several), or finish the unfinished one from a "
                          "checkout of its code" if field == "code" else
                          f"; merge joins the shards, or the runs of other methods, of one set of contexts: "
                          f"{OTHER_CONTEXTS}" if field in ("run tasks", "run n", "run haystack") else "")
        raise UsageError(f"{first.path} and {other.path} are not shards of one run: they differ in {field} "
                         f"({', '.join(values)} against {', '.join(theirs[field])}){other_contexts}")


def _shards_held(store: ResultStore) -> str:
    return ", ".join(sorted({f"{row[RUN]['shard']}/{row[RUN]['shards']}" for row in store.rows if RUN in row}))


def _is_part(rows: list[dict]) -> bool:
    """Whether ``rows`` hold a part of a sharded run: not every shard of it that has contexts (a shard of more
    shards than the run has contexts holds none)."""
    held: dict[str, tuple[dict, set[int]]] = {}
    for row in rows:
        if RUN in row:
            run = row[RUN]
            held.setdefault(repr([run[field] for field in RUN_SHARED]), (run, set()))[1].add(run["shard"])
    return any(k not in shards for run, shards in held.values() for k in shards_with_contexts(run))


def _group_of(row: dict) -> tuple:
    """The setting group of ``row`` (:data:`~bench.store.row_fields.SHARED_FIELDS`): rows of one group are of one
    run."""
    return tuple(str(row.get(field)) for field in SHARED_FIELDS)


def check_complete(stores: list[ResultStore], every_shard: bool = True) -> None:
    """``UsageError`` naming what the rows of ``stores`` lack together: a context of a run no row holds (of any
    shard of it, or with ``every_shard`` False of the shards held only), or a context without the rows of every
    method and question of its setting group."""
    entries = [(row, store, line) for store in stores for row, line in zip(store.rows, store.line_numbers)]
    groups: dict[tuple, list[Entry]] = defaultdict(list)
    for entry in entries:
        groups[_group_of(entry[0])].append(entry)
    for held in groups.values():  # first: a method's rows are told apart by its fractions as shown
        check_one_fraction_shown(held)
    for group, held in sorted(groups.items(), key=lambda item: (len(item[1]), item[0])):
        gap = _missing_context(held, every_shard) or _missing_rows(held)
        if gap is None:
            continue
        lacks, advice = gap
        if advice in (RERUN, RERUN_NAMED):
            advice = _rerun_here(held[0][0]) or advice
        if len(groups) == 1:
            raise UsageError(f"{_where(held)} {lacks}; {advice}")
        them, were = ("it", "it was") if len(held) == 1 else ("them", "they were")
        raise UsageError(f"{_where(held)} ({_apart(group, held, groups)}) {lacks}. If {were} written here by "
                         f"mistake, remove {them} (or keep {them} in another store); else "
                         f"{RERUN_THOSE if advice == RERUN else advice}")
    _check_seeds_alike(groups)


def _check_seeds_alike(groups: dict[tuple, list[Entry]]) -> None:
    """``UsageError`` where the setting groups of one report (:data:`~bench.store.row_fields.GROUP_FIELDS`: they
    differ in their seed alone) hold other methods: a report pools the items of every seed and compares its methods
    on the same contexts, so each seed holds every method of the others (each group is whole by then)."""
    by_report: dict[tuple, dict] = defaultdict(dict)
    for held in groups.values():
        row = held[0][0]
        report = tuple(str(row.get(field)) for field in GROUP_FIELDS)
        by_report[report][row.get("seed")] = (held, {method_at(r) for r, _, _ in held})
    for seeds in by_report.values():
        every = set().union(*(methods for _, methods in seeds.values()))
        for seed, (held, methods) in sorted(seeds.items(), key=lambda item: str(item[0])):
            if methods != every:
                others = sorted(str(s) for s in seeds if s != seed)
                raise UsageError(f"{_where(held)} (seed {seed}) lack the rows of {listed(sorted(every - methods))}, "
                                 f"which the rows of seed(s) {', '.join(others)} of the same setting hold: a report "
                                 "pools the items of every seed and compares its methods on the same contexts. Run "
                                 f"those methods with --seed {seed} too (bench compare resumes the store and adds "
                                 "them), or keep each seed's runs in a store of its own")


def _rerun_here(row: dict) -> str | None:
    """Advice for a run that stopped when its rows are of another code version than this checkout's, or None: a
    rerun here would start that run anew under this code, never finish those rows."""
    here = code_version(row.get("engine", "hf"))
    if row.get("code") in (None, here):
        return None
    return (f"its rows are of code {row['code']} and this checkout's code is {here} (code that decides values "
            "changed since), so a rerun here starts the run anew instead of finishing it: finish it from a checkout "
            "of that code, or move these rows to another store and rerun")


def check_one_fraction_shown(held: list[Entry]) -> None:
    """``UsageError`` naming the lines of two kept fractions of one method in ``held`` (the rows of one setting
    group) that differ but are shown alike (:func:`~bench.store.row_fields.shown_fraction`: 0.3 and 0.3000001): a report
    would show one setting twice, each with its own rows."""
    fractions: dict[tuple, dict[float, list[Entry]]] = defaultdict(lambda: defaultdict(list))
    for entry in held:
        row = entry[0]
        fractions[(method_of(row), shown_fraction(row["keep_fraction"]))][row["keep_fraction"]].append(entry)
    for (method, shown), by_value in fractions.items():
        if len(by_value) > 1:
            (first, there), (second, here) = islice(sorted(by_value.items()), 2)
            raise UsageError(f"{_where(there)} and {_where(here)} hold {method} at kept fractions {first!r} and "
                             f"{second!r}, one fraction where reports show them (p={shown}): a report would show "
                             "it twice. Keep the rows of one (remove the other's lines, or write them to another "
                             "store); bench compare resumes a fraction given as stored")


def _apart(group: tuple, held: list[Entry], groups: dict[tuple, list[Entry]]) -> str:
    """What sets a group's rows apart from the largest other group: ``1 row of code b; the other 3 rows are of code
    a``."""
    other = max((key for key in groups if key != group), key=lambda key: len(groups[key]))
    differ = [(field, mine, theirs) for field, mine, theirs in zip(SHARED_FIELDS, group, other) if mine != theirs]
    mine = ", ".join(f"{field} {value}" for field, value, _ in differ)
    theirs = ", ".join(f"{field} {value}" for field, _, value in differ)
    rest = (f"the other {_rows(len(groups[other]))} are of" if len(groups) == 2 else
            f"the largest other group, {_rows(len(groups[other]))}, is of")
    return f"{_rows(len(held))} of {mine}; {rest} {theirs}"


def _rows(count: int) -> str:
    return f"{count} row" if count == 1 else f"{count} rows"


def _missing_rows(held: list[Entry]) -> Gap | None:
    """A context of the group without the rows of every method of the group and every question of the context: its
    questions 0 … n − 1 where its rows record their count n (:data:`~bench.store.row_fields.QUESTIONS`), else those its
    rows hold; or a row of a question its context does not have."""
    contexts: dict[tuple, set] = defaultdict(set)
    counts: dict[tuple, int] = {}
    for row, store, line in held:
        context = (row["task"], row["haystack"], row["item"])
        contexts[context].add((method_at(row), row["question"]))
        count = row.get(QUESTIONS)
        if count is None:
            continue
        where = f"{store.path}:{line}"
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            return (f"names {QUESTIONS}={count!r} at {where} (expected how many questions task {row['task']}, item "
                    f"{row['item']} has: an integer >= 1)", NOT_WRITTEN)
        if row["question"] >= count:
            return (f"holds question {row['question']} of task {row['task']}, item {row['item']} at {where}, which "
                    f"has {count} question(s), 0 … {count - 1}", NOT_WRITTEN)
        counts[context] = max(count, counts.get(context, 0))
    methods = sorted({method for answered in contexts.values() for method, _ in answered})
    runs_of = _runs_by(held)
    for context, answered in contexts.items():
        # a range, never listed: a count is not bounded by the rows that hold it
        questions = range(counts[context]) if context in counts else sorted({q for _, q in answered})
        missing = len(methods) * len(questions) - len(answered)  # every row held is of a method and a question here
        if missing:
            lacking = [method for method in methods if any((method, q) not in answered for q in questions)]
            unrun = next((method for method in lacking
                          if runs_of[method] and not runs_of[method] & runs_of[("context", context)]), None)
            if unrun is not None:  # two runs of other contexts pooled, not a run that stopped
                return (f"holds runs of other contexts: {unrun} was run on {_runs_named(runs_of[unrun])}, not on "
                        f"task {context[0]}, item {context[2]}, which a run of "
                        f"{_runs_named(runs_of[('context', context)])} holds", OTHER_CONTEXTS)
            gone = islice((f"{method} question {q}" for method in methods for q in questions
                           if (method, q) not in answered), SHOWN)
            return (f"is incomplete: task {context[0]}, item {context[2]} lacks the rows of "
                    f"{listed(list(gone), missing)}", RERUN_NAMED)
    return None


def _runs_by(held: list[Entry]) -> dict:
    """The runs (:data:`RUN_SHARED` of :data:`~bench.store.row_fields.RUN`, as a tuple) the rows of each method name,
    and of each context under the key ``("context", context)``; rows written before runs were recorded name none."""
    runs: dict = defaultdict(set)
    for row, _, _ in held:
        if RUN in row:
            run = tuple(tuple(value) if isinstance(value, list) else value
                        for value in (row[RUN][field] for field in RUN_SHARED))
            runs[method_at(row)].add(run)
            runs[("context", (row["task"], row["haystack"], row["item"]))].add(run)
    return runs


def _runs_named(runs: set) -> str:
    """``tasks niah_single_1, n 2`` of each run in ``runs`` (see :func:`_runs_by`), joined by "or"."""
    return " or ".join(f"tasks {', '.join(run[0])}, n {run[1]}" for run in sorted(runs, key=repr))


def _missing_context(held: list[Entry], every_shard: bool) -> Gap | None:
    """A context of a run the group's rows name that none of them holds: a shard missing, shards of two splits of
    one run, or a context its run stopped before."""
    present = {(row["task"], row["haystack"], row["item"]) for row, _, _ in held}
    runs: dict[str, list[Entry]] = defaultdict(list)
    for entry in held:
        run = entry[0].get(RUN)
        if run is not None:  # one run and split, and with every_shard False one shard
            runs[repr([run[field] for field in ("tasks", "n", "haystack", "shards")] +
                      ([] if every_shard else [run["shard"]]))].append(entry)
    for rows in runs.values():
        run, count = rows[0][0][RUN], rows[0][0][RUN]["shards"]
        held_shards = sorted({row[RUN]["shard"] for row, _, _ in rows})
        wanted = shards_with_contexts(run) if every_shard else held_shards
        haystacks = {task: haystack_of(task, run["haystack"]) for task in run["tasks"]}
        missing = next(((k, task, item) for k in wanted for task, item in shard_contexts({**run, "shard": k})
                        if (task, haystacks[task], item) not in present), None)
        if missing is None:
            continue
        k, task, item = missing
        splits = _splits(held, run)
        if len(splits) > 1:
            named = " and ".join(f"{_where(split)} (shard {_shards(split)})" for split in splits.values())
            return (f"mixes {len(splits)} splits of one run: {named}; task {task}, item {item} is in neither",
                    "the shards of one run are of one --shard K/N split (one N): merge or give the stores of one split")
        lost = next((shard for shard in wanted if shard not in held_shards), None)
        if lost is not None:
            return (f"holds shard {_shards(rows)} of a run of {count} shards; shard {lost}/{count} is missing: no row "
                    f"holds {_lost_contexts(run, lost, present, haystacks)}",
                    "give the stores of every shard (bench compare --shard K/N writes each), or bench merge them "
                    "into one")
        shard = f" (shard {k}/{count})" if count > 1 else ""
        return (f"is incomplete: no row holds task {task}, item {item}{shard} of its run (items 0 … {run['n'] - 1} of "
                f"{listed(run['tasks'])})", RERUN)
    return None


def _lost_contexts(run: dict, shard: int, present: set, haystacks: dict) -> str:
    """The first :data:`SHOWN` contexts of ``run``'s ``shard`` no row holds, and how many more: counted, not listed
    (a run of ``--n 100000000`` names them at once)."""
    contexts = shard_contexts({**run, "shard": shard})
    held = sum(1 for task, haystack, item in present if haystacks.get(task) == haystack and (task, item) in contexts)
    gone = islice((f"task {task}, item {item}" for task, item in contexts
                   if (task, haystacks[task], item) not in present), SHOWN)
    return listed(list(gone), len(contexts) - held)


def _splits(held: list[Entry], run: dict) -> dict[int, list[Entry]]:
    """The rows of the runs of ``run``'s contexts (its tasks, n and haystack), by their shard count."""
    splits: dict[int, list[Entry]] = defaultdict(list)
    for entry in held:
        other = entry[0].get(RUN)
        if other is not None and all(other[field] == run[field] for field in ("tasks", "n", "haystack")):
            splits[other["shards"]].append(entry)
    return dict(sorted(splits.items()))


def _shards(rows: list[Entry]) -> str:
    """The shards ``rows`` are of: ``0/2``, ``0/2, 1/2``."""
    held = sorted({(row[RUN]["shard"], row[RUN]["shards"]) for row, _, _ in rows})
    return ", ".join(f"{k}/{count}" for k, count in held)


def listed(values: list[str], total: int | None = None) -> str:
    """The first :data:`SHOWN` of ``values``, in their order, for a message; how many more there are (of ``total``,
    where ``values`` are its first ones only)."""
    total = len(values) if total is None else total
    return ", ".join(values[:SHOWN]) + (f", … ({total - SHOWN} more)" if total > SHOWN else "")


def _where(entries: list[Entry]) -> str:
    """The files of ``entries``: a file alone where they are all of its rows, else with their lines as ranges
    (``results.jsonl:1-40, 57``)."""
    lines: dict[ResultStore, list[int]] = defaultdict(list)
    for _, store, line in entries:
        lines[store].append(line)
    named = []
    for store, numbers in lines.items():
        if len(numbers) == len(store.rows):
            named.append(str(store.path))
            continue
        ranges: list[list[int]] = []
        for number in sorted(numbers):
            if ranges and number == ranges[-1][1] + 1:
                ranges[-1][1] = number
            else:
                ranges.append([number, number])
        named.append(f"{store.path}:{listed([str(a) if a == b else f'{a}-{b}' for a, b in ranges])}")
    return ", ".join(named)

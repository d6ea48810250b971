"""Whether result stores hold whole runs: every shard of every run, every context of each, every method and question
of every context.

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

from collections import defaultdict
from itertools import islice

from runtime.errors import UsageError
from workloads.tasks.registry import haystack_of

from .code_version import code_version
from .collection import collection_stores
from .result_store import ResultStore
from .row_fields import (
    BASELINE,
    GROUP_FIELDS,
    QUESTIONS,
    RUN,
    RUN_SHARED,
    SHARED_FIELDS,
    method_at,
    method_of,
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
NO_BASELINE = ("every run writes a context's no-prune rows before its children, so they were removed after it: "
               "restore the store from its run's own copy, or rerun it into a store of its own")
"""The advice for children whose no-prune row no store given holds (probe 14: a store without them passed, its ΔNLL
never checked; a method joining a collection's group finds them in the group's ``none`` store)."""
NO_PRUNE = method_at({"press": BASELINE, "keep_fraction": 1.0})
"""The no-prune row's method as :func:`~bench.store.row_fields.method_at` names it (``none p=1``)."""
SHOWN = 5
"""How many missing rows or methods a message lists."""
Entry = tuple[dict, ResultStore, int]
"""A row, the store that holds it and its line there."""
Gap = tuple[str, str]
"""What a group's rows lack, said after their files (``is incomplete: …``), and what to do about it."""


def group_of(row: dict) -> tuple:
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
        groups[group_of(entry[0])].append(entry)
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
    rows hold; a child without the no-prune row of its question, named first (the group may hold no no-prune row at
    all), unless it is a collection's (its group's no-prune rows are another store of it, ``none/``, which
    :func:`~bench.store.store_checks.check_group_baselines` holds it to: it must be there and hold them); or a row of
    a question its context does not have."""
    contexts: dict[tuple, set] = defaultdict(set)
    counts: dict[tuple, int] = {}
    own: dict[tuple, set] = defaultdict(set)  # each context's (method, question) of stores that are no collection's
    published = {id(store) for store in collection_stores(list({id(store): store for _, store, _ in held}.values()))}
    for row, store, line in held:
        context = (row["task"], row["haystack"], row["item"])
        contexts[context].add((method_at(row), row["question"]))
        if id(store) not in published:
            own[context].add((method_at(row), row["question"]))
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
        # a run writes a context's no-prune rows before any child, so a child without one was never a stopped run
        unmeasured = min((q for method, q in own[context] if method != NO_PRUNE and (NO_PRUNE, q) not in answered),
                         default=None)
        if unmeasured is not None:
            return (f"is incomplete: the no-prune row of task {context[0]}, item {context[2]}, question {unmeasured} "
                    "is missing, against which its children's ΔNLL and KL were measured", NO_BASELINE)
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

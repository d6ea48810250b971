"""``bench merge``: the stores of one run's shards (``bench compare --shard K/N``) joined into one store.

Shards of one run share every setting: the group fields (model, weights, artifacts, profile, length, code
version, engine, dtype, device), the seed, the methods, and the run their rows name (its tasks, n and haystack, and
one split into N shards). Before anything is written, each shard is checked whole (no last line cut short, every
context of its shard with the rows of every method and question), the shards against each other, and what the
merged store would hold: every shard of the run. What is wrong is named with the store: a damaged or unfinished
shard, stores of other settings or of two splits, a missing shard, or a row two stores hold with other values.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from artifacts.outputs import Output
from runtime.errors import UsageError

from .arguments import Command
from .completeness import check_complete, check_given_once, check_not_cut
from .store import RUN, SHARED_FIELDS, ResultStore, check_one_value, listed, method_at

RUN_SHARED = ("tasks", "n", "haystack", "shards")
"""What the rows of every shard of one run name alike of their run (:data:`bench.store.RUN`): all but the shard."""


def _settings_of(store: ResultStore) -> dict:
    """What every shard of one run shares: each field's values, the methods (press/allocator at each p), and each
    field of the run the rows name but the shard (``–`` for rows that name none)."""
    shared = {field: sorted({str(row.get(field)) for row in store.rows}) for field in SHARED_FIELDS}
    shared["methods"] = sorted({method_at(row) for row in store.rows})
    for field in RUN_SHARED:
        shared[f"run {field}"] = sorted({str(row[RUN][field]) if RUN in row else "–" for row in store.rows})
    return shared


def _shards_held(store: ResultStore) -> str:
    return ", ".join(sorted({f"{row[RUN]['shard']}/{row[RUN]['shards']}" for row in store.rows if RUN in row}))


def _check_shards_of_one_run(first: ResultStore, other: ResultStore) -> None:
    mine, theirs = _settings_of(first), _settings_of(other)
    for field, values in mine.items():
        if theirs[field] == values:
            continue
        only_mine, only_theirs = set(values) - set(theirs[field]), set(theirs[field]) - set(values)
        if field == "methods" and not (only_mine and only_theirs):  # one shard holds a part of the other's
            small, large, lacking = (first, other, only_theirs) if not only_mine else (other, first, only_mine)
            raise UsageError(f"{small.path} holds no rows of {listed(lacking)}, which {large.path} holds: the run "
                             f"of {small.directory} did not finish (rerun it, it resumes), or it ran fewer methods "
                             "and is not a shard of the same run")
        if field == "run shards":
            raise UsageError(f"{first.path} holds shard {_shards_held(first)} and {other.path} shard "
                             f"{_shards_held(other)}: the shards of one run are of one --shard K/N split (one N); "
                             "merge the stores of one split")
        raise UsageError(f"{first.path} and {other.path} are not shards of one run: their {field} differ "
                         f"({', '.join(values)} against {', '.join(theirs[field])})")


def merge_stores(sources: list[Path], out: Path) -> int:
    """Append every row of ``sources`` to the store in ``out`` (created if need be; a committed ``.gz`` there is
    resumed, :class:`~bench.store.ResultStore`); returns the rows added.

    Raises
    ------
    ValueError
        A source given twice, an empty, damaged or unfinished source, sources of different settings or splits, a
        row two sources hold with other values, a shard of the run that neither the sources nor ``out`` hold
        (:func:`bench.completeness.check_complete`), or an ``out`` that holds results of other settings.
    """
    stores = [ResultStore(source, readonly=True) for source in sources]
    check_given_once(stores)
    for store in stores:
        store.check_rows()
        if not store.rows:
            raise UsageError(f"{store.path}: no results to merge (an empty shard — one of more shards than the run "
                             "has contexts — holds none: leave it out)")
        check_not_cut([store])
        check_complete([store], every_shard=False)
    for store in stores[1:]:
        _check_shards_of_one_run(stores[0], store)
    check_one_value(stores, copies=True)
    target = ResultStore(out)
    try:
        target.check_schema()
        first = _settings_of(stores[0])
        held = _settings_of(target) if target.rows else first
        if any(held[field] != first[field] for field in SHARED_FIELDS):
            raise UsageError(f"{target.path} holds results of other settings; merge into a new directory")
        check_complete([*stores, target])  # every shard of the run, here or in the sources
        before = len(target.rows)
        for store in stores:
            for row in store.rows:
                target.append(row)  # a key already there (another copy of the row) is skipped
        return len(target.rows) - before
    finally:
        target.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("stores", nargs="+", help="result directories of the shards (bench compare --shard K/N)")
    parser.add_argument("--out", required=True, help="the merged store's directory")


def run(args) -> None:
    added = merge_stores([Path(s) for s in args.stores], Path(args.out))
    print(f"{added} rows added to {Path(args.out) / 'results.jsonl'}")


MERGE = Command("merge", "join the stores of one run's shards (compare --shard K/N) into one", add_arguments, run,
                loads_models=False,
                outputs=lambda args: [Output(Path(args.out), "--out")])

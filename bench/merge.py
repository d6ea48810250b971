"""``bench merge``: the stores of one run's shards (``bench compare --shard K/N``) joined into one store.

Shards of one run share every setting: the group fields (model, weights, artifacts, profile, length, code
version, engine, dtype, device), the seed and the methods. Before anything is written, each shard is checked whole
(no last line cut short, every context with the rows of every method and question) and the shards against each
other; what is wrong is named with the store: a damaged or unfinished shard, stores of other settings, or a row two
stores hold with other values.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from runtime.errors import UsageError

from .arguments import Command
from .store import SHARED_FIELDS, ResultStore, check_one_value, listed, method_at


def _settings_of(store: ResultStore) -> dict:
    """What every shard of one run shares: each field's values, and the methods (press/allocator at each p)."""
    shared = {field: sorted({str(row.get(field)) for row in store.rows}) for field in SHARED_FIELDS}
    shared["methods"] = sorted({method_at(row) for row in store.rows})
    return shared


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
        raise UsageError(f"{first.path} and {other.path} are not shards of one run: their {field} differ "
                         f"({', '.join(values)} against {', '.join(theirs[field])})")


def merge_stores(sources: list[Path], out: Path) -> int:
    """Append every row of ``sources`` to the store in ``out`` (created if need be); returns the rows added.

    Raises
    ------
    ValueError
        An empty, damaged or unfinished source (:meth:`bench.store.ResultStore.check_complete`), sources of
        different settings, a row two sources hold with other values, or an ``out`` that holds results of other
        settings.
    """
    stores = [ResultStore(source, readonly=True) for source in sources]
    for store in stores:
        store.check_rows()
        if not store.rows:
            raise UsageError(f"{store.path}: no results to merge (an empty shard — one of more shards than the run "
                             "has contexts — holds none: leave it out)")
        store.check_complete()
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
                loads_models=False)

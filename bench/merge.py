"""``bench merge``: the stores of one run's shards (``bench compare --shard K/N``) joined into one store.

Shards of one run share every setting: the group fields (model, weights, artifacts, profile, length, code
version, engine, dtype, device), the seed and the methods. Stores that differ in any of them are refused before
anything is written, naming the setting and the two stores; so is a row present in two stores with other values.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .arguments import Command
from .stats import method_of
from .store import GROUP_FIELDS, ResultStore, row_key

SHARED_FIELDS = (*GROUP_FIELDS, "seed")


def _settings_of(store: ResultStore) -> dict:
    """What every shard of one run shares: each field's values, and the methods (press/allocator at each p)."""
    shared = {field: sorted({str(row.get(field)) for row in store.rows}) for field in SHARED_FIELDS}
    shared["methods"] = sorted({f"{method_of(row)} p={row['keep_fraction']:g}" for row in store.rows})
    return shared


def merge_stores(sources: list[Path], out: Path) -> int:
    """Append every row of ``sources`` to the store in ``out`` (created if need be); returns the rows added.

    Raises
    ------
    ValueError
        An empty source, sources of different settings, a row two sources hold with other values, or an ``out``
        that holds results of other settings.
    """
    stores = [ResultStore(source, readonly=True) for source in sources]
    for store in stores:
        store.check_rows()
        if not store.rows:
            raise ValueError(f"{store.path}: no results to merge")
    first = _settings_of(stores[0])
    for store in stores[1:]:
        other = _settings_of(store)
        for field, values in first.items():
            if other[field] != values:
                raise ValueError(f"{stores[0].path} and {store.path} are not shards of one run: their {field} "
                                 f"differ ({', '.join(values)} against {', '.join(other[field])})")
    rows: dict[tuple, dict] = {}
    for store in stores:
        for row in store.rows:
            key = row_key(row)
            if key in rows and _values(rows[key]) != _values(row):
                raise ValueError(f"{store.path} and another store hold the row of {method_of(row)} at "
                                 f"p={row['keep_fraction']:g}, task {row['task']}, item {row['item']}, question "
                                 f"{row['question']} with other values; they are not shards of one run")
            rows.setdefault(key, row)
    target = ResultStore(out)
    try:
        target.check_schema()
        held = _settings_of(target) if target.rows else first
        if any(held[field] != first[field] for field in SHARED_FIELDS):
            raise ValueError(f"{target.path} holds results of other settings; merge into a new directory")
        before = len(target.rows)
        for row in rows.values():
            target.append(row)
        return len(target.rows) - before
    finally:
        target.close()


def _values(row: dict) -> dict:
    # the timings of one context are measured where it ran: two copies of a row may differ in them alone
    return {k: v for k, v in row.items() if not k.endswith("_seconds")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("stores", nargs="+", help="result directories of the shards (bench compare --shard K/N)")
    parser.add_argument("--out", required=True, help="the merged store's directory")


def run(args) -> None:
    added = merge_stores([Path(s) for s in args.stores], Path(args.out))
    print(f"{added} rows added to {Path(args.out) / 'results.jsonl'}")


MERGE = Command("merge", "join the stores of one run's shards (compare --shard K/N) into one", add_arguments, run,
                loads_models=False)

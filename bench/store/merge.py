"""``bench merge``: the stores of one run's shards (``bench compare --shard K/N``), or of runs of other methods on
the same contexts, joined into one store.

Shards of one run share every setting: the group fields (model, weights, artifacts, profile, length, code
version, engine, dtype, device), the seed, the methods, and the run their rows name (its tasks, n and haystack, and
one split into N shards). Runs of other methods share all of them but the methods (each holds some the other lacks;
their no-prune rows, answered alike, are kept once, and so are the rows of a method both hold: answered in other
padded batches, they may differ in their last digits, :data:`~bench.store.row_fields.BATCH`, and the first copy is
kept): reports read the rows of one run from one store.

Before anything is written, each store is checked as ``bench verify`` checks one (every line a valid row, one method
code per method, no last line cut short, every context of its shard with the rows of every method and question, each
key one value), the stores against each other, and what the merged store would hold: every
shard of the run. What is wrong is named with the store: a damaged or unfinished shard, stores of other settings or
of two splits, a missing shard, or a row two stores hold with other values than another padded batch explains.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from artifacts.output_kinds import RESULT_STORE
from artifacts.outputs import Output
from pretrained.cache_guard import check_outside_the_cache
from runtime.errors import UsageError

from .completeness import check_complete
from .copies import check_one_value
from .result_store import ResultStore, open_stores
from .row_fields import SHARED_FIELDS
from .shards import check_shards_alike, shard_settings
from .store_checks import check_given_once, check_methods_alike, check_stores


def _settings_of(store: ResultStore) -> dict[str, list[str]]:
    """What every shard of one run shares: each field's values, the methods and each field of the run the rows name
    but the shard (:func:`~bench.store.shards.shard_settings`)."""
    shared = {field: sorted({str(row.get(field)) for row in store.rows}) for field in SHARED_FIELDS}
    return {**shared, **shard_settings(store.rows)}


class Merged(NamedTuple):
    """What :func:`merge_stores` did."""

    added: int
    """Rows added to the merged store."""
    other_batches: int
    """Rows held twice (by two sources, or by a source and the merged store) with fidelity values that differ as
    their padded batches differ (:data:`~bench.store.row_fields.BATCH`,
    :data:`~bench.store.copies.BATCH_TOLERANCE`): the first copy is kept (the merged store's, else the first
    source's)."""
    largest_difference: float
    """The largest difference of those rows' fidelity values (0 where there are none)."""
    path: Path
    """The file that holds the merged rows: ``results.jsonl``, or a committed ``results.jsonl.gz`` that no row was
    added to (a store is unpacked only to append)."""


def merge_stores(sources: list[str | Path], out: str | Path) -> Merged:
    """Append every row of ``sources`` to the store in ``out`` (created if need be; a committed ``.gz`` there is
    resumed, :class:`~bench.store.result_store.ResultStore`), one copy of each row key.

    Raises
    ------
    ValueError
        A source given twice, an empty, damaged or unfinished source, sources of different settings or splits, a row two
        sources (or a source and ``out``) hold with other values than another padded batch explains, a shard of the run
        that neither the sources nor ``out`` hold (:func:`bench.store.completeness.check_complete`), or an ``out`` that
        holds results of other settings.
    """
    if isinstance(sources, (bytes, bytearray)):  # iterating them would read each byte (a number) as a store
        raise UsageError(f"sources={sources!r} are bytes: give a list of store directories (str or Path)")
    if isinstance(sources, (str, os.PathLike)):  # iterating one path would read each of its characters as a store
        raise UsageError(f"sources={str(sources)!r} is one path: give a list of store directories, "
                         f"[{str(sources)!r}, …]")
    sources = list(sources)
    if not sources:
        raise UsageError("no store to merge: give the stores of one run's shards, or of runs of other methods")
    for name, given in [*(("a source", source) for source in sources), ("out", out)]:
        if not isinstance(given, (str, os.PathLike)) or not str(given).strip():
            raise UsageError(f"{name} {given!r} is not a directory path ('' would mean the current folder): give "
                             "the store's directory")
    out = Path(out)
    check_outside_the_cache([Output(out, "out", kind_of=RESULT_STORE)])
    stores = open_stores([Path(source) for source in sources])
    check_given_once(stores)
    for store in stores:  # each source as bench verify checks a store: no bad line nor a method's other code is
        check_stores([store], source=True)  # laundered into the merged store
        if not store.rows:
            raise UsageError(f"{store.path}: no results to merge (an empty shard — one of more shards than the run "
                             "has contexts — holds none: leave it out)")
    first = _settings_of(stores[0])
    for store in stores[1:]:
        check_shards_alike(stores[0], first, store, _settings_of(store), other_methods=True)
    check_one_value(stores, copies=True)
    target = ResultStore(out, named="out")
    try:
        target.check_schema()
        held = _settings_of(target) if target.rows else first
        if any(held[field] != first[field] for field in SHARED_FIELDS):
            raise UsageError(f"{target.path} holds results of other settings; merge into a new directory")
        # rows all of these sources hold: this merge, stopped part way before, is finished (the rows already there
        # are not added twice), not checked as one more source
        resumed = target.done <= set().union(*(store.done for store in stores))
        if target.rows and not resumed:  # one more source: a shard of one run, or a run of other methods
            check_shards_alike(target, held, stores[0], first, other_methods=True)
        check_complete(stores if resumed else [*stores, target])  # every shard of the run, here or in the sources
        check_methods_alike([target, *stores])
        differences = check_one_value([target, *stores], copies=True)  # the copy kept first
        before = len(target.rows)
        for store in stores:
            for row in store.rows:
                target.append(row)  # a key already there (another copy of the row) is skipped
        return Merged(len(target.rows) - before, len(differences), max(differences, default=0.0), target.path)
    finally:
        target.close()

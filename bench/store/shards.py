"""Whether stores are shards of one run: a store that holds a part of a sharded run is of one ``--shard K/N`` split
with the other stores of its setting group, and holds the same methods and run settings (as ``bench merge``
compares them)."""

from __future__ import annotations

from collections import defaultdict

from runtime.errors import UsageError

from .completeness import OTHER_CONTEXTS, group_of, listed
from .result_store import ResultStore
from .row_fields import (
    RUN,
    RUN_SHARED,
    method_at,
    shards_with_contexts,
)


def check_one_split(stores: list[ResultStore]) -> None:
    """``UsageError`` naming a store that holds a part of a sharded run (not every shard of it) and another store of
    its setting group that is not a shard of that run and split, or holds other methods (:func:`check_shards_alike`,
    as ``bench merge`` compares them). Together the two may hold every context their runs name — shard 0/2 and shard
    1/3 of a run of two contexts do, and so do shard 0/2 of one press and shard 1/2 of another — but ``bench merge``
    refuses to join them, and a store holds the rows of one split of one run."""
    groups: dict[tuple, dict[ResultStore, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for store in stores:
        for row in store.rows:
            groups[group_of(row)][store].append(row)
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
    the same contexts (the rows both hold must agree: :func:`~bench.store.copies.check_one_value`)."""
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

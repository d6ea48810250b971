"""The cost beside the quality: each scorer's time as a share of the prefill whose cache it compresses.

A press scores a context once, whatever its allocator and kept fraction, so every row of one press on one context
carries the same ``score_seconds``; the context's rows carry its ``prefill_seconds``. A cell is, per task, the mean
over contexts of ``score_seconds / prefill_seconds``, averaged over the tasks (each weighs the same), with the
paired-bootstrap interval over contexts (:class:`bench.stats.PairedBootstrap`) that every other cell has. The times
are those of the run that wrote the rows (its device, its threads, what ran beside it): a ratio within one run is
what they support, not seconds across runs.
"""

from __future__ import annotations

from .row_fields import BASELINE
from .stats import PairedBootstrap

SHARE = "scoring_share"
"""The field of the per-context rows this table bootstraps."""


def scoring_rows(rows: list[dict]) -> list[dict]:
    """One row per (press, context) with its :data:`SHARE` and ``score_seconds``, named ``press/any`` at kept
    fraction 1 (the allocator and the fraction do not change a press's scoring); rows without both times (stores
    from before they were recorded, a prefill timed at 0) are left out."""
    out: dict[tuple, dict] = {}
    for row in rows:
        if row["press"] == BASELINE or not row.get("prefill_seconds") or row.get("score_seconds") is None:
            continue
        key = (row["press"], row["task"], row.get("haystack"), row.get("seed", 0), row["item"])
        out.setdefault(key, {"task": row["task"], "haystack": row.get("haystack", "generated"),
                             "seed": row.get("seed", 0), "item": row["item"], "press": row["press"],
                             "allocator": "any", "keep_fraction": 1.0, "score_seconds": row["score_seconds"],
                             SHARE: row["score_seconds"] / row["prefill_seconds"]})
    return list(out.values())


def scoring_cost_markdown(rows: list[dict], resamples: int = 1000) -> list[str]:
    """The table ``### Cost: scoring time as a share of prefill`` of one setting group; empty where its rows hold
    no times."""
    per_context = scoring_rows(rows)
    if not per_context:
        return []
    share, seconds = PairedBootstrap(per_context, SHARE, resamples), PairedBootstrap(per_context, "score_seconds",
                                                                                     resamples)
    # like for like: the tasks every press scored
    tasks = [t for t in share.tasks if all(share.has(method, 1.0, t) for method, _ in share.cells)]
    if not tasks:
        return []
    contexts = min(share.n_items(t) for t in tasks)
    lines = ["### Cost: scoring time as a share of prefill", "",
             f"Per context, the press's scoring time (once, whatever its allocator and kept fraction) over the "
             f"context's prefill time, averaged over {len(tasks)} task(s), n ≥ {contexts} contexts each; times of the "
             "run that wrote these rows.", "",
             "| press | scoring (ms) | share of prefill (%) |", "|---|---|---|"]
    for method, _ in share.cells:
        lines.append(f"| {method.removesuffix('/any')} | {seconds.average(method, 1.0, tasks).format(1000, 1)} "
                     f"| {share.average(method, 1.0, tasks).format(100, 1)} |")
    return lines + [""]

"""The cost beside the quality: each scorer's time as a share of the prefill whose cache it compresses.

A press scores a context once, whatever its allocator and kept fraction, so every row of one press on one context
carries the same ``score_seconds``; the context's rows carry its ``prefill_seconds``. A cell is, per task, the mean
over contexts of ``score_seconds / prefill_seconds``, averaged over the tasks (each weighs the same), with the
paired-bootstrap interval over contexts (:class:`bench.reports.stats.PairedBootstrap`) that every other cell has. The
times are those of the run that wrote the rows (its device, its threads, what ran beside it): a ratio within one run is
what they support, not seconds across runs.
"""

from __future__ import annotations

import math

from ..store.row_fields import BASELINE
from .markdown_text import escaped
from .stats import PairedBootstrap

SHARE = "scoring_share"
"""The field of the per-context rows this table bootstraps."""


def _time(value) -> float | None:
    """A recorded time in seconds as a number, or None where it is none (absent, text, not finite, negative)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def _context(row: dict) -> tuple:
    return row["task"], row.get("haystack", "generated"), row.get("seed", 0), row["item"]


def scoring_rows(rows: list[dict]) -> list[dict]:
    """One row per (press, context) with its :data:`SHARE` and ``score_seconds``, named ``press/any`` at kept
    fraction 1 (the allocator and the fraction do not change a press's scoring). A press scored on one context by
    more than one run (their rows merged, each with its own prefill) is the mean of those measurements, each over
    its own run's prefill; rows without both times (stores from before they were recorded, a prefill timed at 0)
    are left out."""
    measured: dict[tuple, set] = {}
    for row in rows:
        prefill, score = _time(row.get("prefill_seconds")), _time(row.get("score_seconds"))
        if row["press"] != BASELINE and prefill and score is not None:
            measured.setdefault((row["press"], *_context(row)), set()).add((score, prefill))
    out = []
    for (press, task, haystack, seed, item), pairs in measured.items():
        out.append({"task": task, "haystack": haystack, "seed": seed, "item": item, "press": press,
                    "allocator": "any", "keep_fraction": 1.0,
                    "score_seconds": sum(score for score, _ in pairs) / len(pairs),
                    SHARE: sum(score / prefill for score, prefill in pairs) / len(pairs)})
    return out


def scoring_cost_markdown(rows: list[dict], resamples: int = 1000) -> list[str]:
    """The table ``### Cost: scoring time as a share of prefill`` of one setting group, on the contexts every timed
    press scored (like for like); empty where its rows hold no times. Presses of the group without times are named
    under it."""
    per_context = scoring_rows(rows)
    timed = {row["press"] for row in per_context}
    if not timed:
        return []
    shared = set.intersection(*({_context(r) for r in per_context if r["press"] == press} for press in timed))
    if not shared:
        return ["### Cost: scoring time as a share of prefill", "",
                f"No context was timed with every press ({', '.join(map(escaped, sorted(timed)))}): no like-for-like "
                "table.", ""]
    per_context = [row for row in per_context if _context(row) in shared]
    share, seconds = PairedBootstrap(per_context, SHARE, resamples), PairedBootstrap(per_context, "score_seconds",
                                                                                     resamples)
    counts = {task: share.n_items(task) for task in share.tasks}
    if len(set(counts.values())) == 1:
        n = next(iter(counts.values()))
        counts = f"{n} context{'s' * (n != 1)} a task"
    else:
        counts = "contexts a task: " + ", ".join(f"{task} {n}" for task, n in counts.items())
    lines = ["### Cost: scoring time as a share of prefill", "",
             f"Per context, the press's scoring time (once, whatever its allocator and kept fraction) over the "
             f"context's prefill time, averaged over {len(share.tasks)} task(s) on the contexts every press below "
             f"was timed on (n = {counts}); times of the run that wrote these rows.", "",
             "| press | scoring (ms) | share of prefill (%) |", "|---|---|---|"]
    for method, _ in share.cells:
        lines.append(f"| {escaped(method.removesuffix('/any'))} | "
                     f"{seconds.average(method, 1.0, share.tasks).format(1000, 1)} "
                     f"| {share.average(method, 1.0, share.tasks).format(100, 1)} |")
    untimed = sorted({row["press"] for row in rows if row["press"] != BASELINE} - timed)
    if untimed:
        lines += ["", "Not timed (rows without both times, or a prefill recorded as 0): "
                      f"{', '.join(map(escaped, untimed))}."]
    return lines + [""]

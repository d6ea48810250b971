"""Tables and figures from result stores: the compare summary, ``bench leaderboard``, accuracy-vs-ratio PNGs."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path
from statistics import mean

from .store import ResultStore

BASELINE = "none"


def _method(row: dict) -> str:
    return BASELINE if row["press"] == BASELINE else f"{row['press']}/{row['allocator']}"


def aggregate(rows: list[dict], field: str = "score") -> dict[tuple[str, str, float], float]:
    """Mean ``field`` ×100 per (method, task, ratio); a row is one question."""
    buckets: dict[tuple, list[float]] = defaultdict(list)
    for row in rows:
        if field in row:
            buckets[(_method(row), row["task"], float(row["ratio"]))].append(float(row[field]))
    return {key: 100 * mean(values) for key, values in buckets.items()}


def common_tasks(table: dict) -> list[str]:
    """Tasks that every method (the no-prune baseline included) was run on."""
    per_method: dict[str, set[str]] = defaultdict(set)
    for method, task, _ in table:
        per_method[method].add(task)
    return sorted(set.intersection(*per_method.values())) if per_method else []


def task_averaged(table: dict) -> dict[tuple[str, float], float]:
    """Mean over tasks of the per-task accuracy, per (method, ratio); only over tasks every method has, so that
    the averages compare like with like."""
    tasks = set(common_tasks(table))
    by_method: dict[tuple, dict[str, float]] = defaultdict(dict)
    for (method, task, ratio), value in table.items():
        if task in tasks:
            by_method[(method, ratio)][task] = value
    return {key: mean(values.values()) for key, values in by_method.items()}


def methods_and_ratios(table: dict) -> tuple[list[str], list[float]]:
    methods = sorted({m for m, _, _ in table if m != BASELINE})
    ratios = sorted({r for m, _, r in table if m != BASELINE})
    return methods, ratios


def summary_markdown(rows: list[dict], field: str = "score") -> str:
    """Task × ratio table per method, then the task-averaged line of every method."""
    table = aggregate(rows, field)
    methods, ratios = methods_and_ratios(table)
    tasks = sorted({t for _, t, _ in table})
    lines = []
    averaged = task_averaged(table)
    baseline = averaged.get((BASELINE, 1.0))
    head = "| method | " + " | ".join(f"p={r:g}" for r in ratios) + " | mean |"
    lines += ["### Task-averaged accuracy (%)", "", f"Averaged over the tasks every method ran: {', '.join(common_tasks(table))}.",
              "", head, "|" + "---|" * (len(ratios) + 2)]
    if baseline is not None:
        lines.append(f"| no prune | " + " | ".join(f"{baseline:.1f}" for _ in ratios) + f" | {baseline:.1f} |")
    for method in methods:
        values = [averaged.get((method, r)) for r in ratios]
        shown = [f"{v:.1f}" if v is not None else "–" for v in values]
        present = [v for v in values if v is not None]
        lines.append(f"| {method} | " + " | ".join(shown) + f" | {mean(present):.1f} |")
    for method in methods:
        lines += ["", f"### {method}: accuracy (%) per task", "",
                  "| task | no prune | " + " | ".join(f"p={r:g}" for r in ratios) + " |",
                  "|" + "---|" * (len(ratios) + 2)]
        for task in tasks:
            base = table.get((BASELINE, task, 1.0))
            cells = [table.get((method, task, r)) for r in ratios]
            lines.append(f"| {task} | {'–' if base is None else f'{base:.0f}'} | "
                         + " | ".join("–" if c is None else f"{c:.0f}" for c in cells) + " |")
    return "\n".join(lines) + "\n"


def allocation_ablation_markdown(rows: list[dict]) -> str:
    """The paper's Table 4 analogue: each scorer under every allocator it ran with, task-averaged."""
    averaged = task_averaged(aggregate(rows))
    by_press: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        if row["press"] != BASELINE:
            by_press[row["press"]].add(row["allocator"])
    ratios = sorted({r for (m, r) in averaged if m != BASELINE})
    lines = ["| press | allocator | " + " | ".join(f"p={r:g}" for r in ratios) + " | mean |",
             "|" + "---|" * (len(ratios) + 3)]
    for press in sorted(by_press):
        if len(by_press[press]) < 2:
            continue
        for alloc in sorted(by_press[press]):
            values = [averaged.get((f"{press}/{alloc}", r)) for r in ratios]
            present = [v for v in values if v is not None]
            lines.append(f"| {press} | {alloc} | " + " | ".join("–" if v is None else f"{v:.1f}" for v in values)
                         + f" | {mean(present):.1f} |")
    return "\n".join(lines) + "\n"


def plot_accuracy(rows: list[dict], path: Path, title: str = "") -> Path:
    """Task-averaged accuracy against kept fraction, one line per method, the no-prune level dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    averaged = task_averaged(aggregate(rows))
    methods, ratios = methods_and_ratios(aggregate(rows))
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    # colour = press, line style = allocator, so that 5 × 4 lines stay readable
    presses_seen = sorted({m.split("/")[0] for m in methods})
    styles = {"flat": "-", "gate": "--", "pyramid": ":", "global": "-."}
    for method in methods:
        press, alloc = method.split("/")
        xs = [r for r in ratios if (method, r) in averaged]
        ax.plot(xs, [averaged[(method, r)] for r in xs], marker="o", markersize=3, label=method,
                color=plt.cm.tab10(presses_seen.index(press) % 10), linestyle=styles.get(alloc, "-"))
    if (BASELINE, 1.0) in averaged:
        ax.axhline(averaged[(BASELINE, 1.0)], color="black", linestyle="--", label="no prune")
    ax.set_xlabel("kept fraction p of the attention KV cache")
    ax.set_ylabel("task-averaged accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def write_leaderboard(stores: list[Path], out: Path) -> Path:
    """``leaderboard.md``, ``leaderboard.csv`` and ``leaderboard.png`` from one or more result stores."""
    rows = [row for directory in stores for row in ResultStore(directory).rows]
    if not rows:
        raise ValueError(f"no results in {', '.join(map(str, stores))}: run `bench compare` first")
    out.mkdir(parents=True, exist_ok=True)
    table = aggregate(rows)
    with (out / "leaderboard.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["method", "task", "ratio", "accuracy"])
        for (method, task, ratio), value in sorted(table.items()):
            writer.writerow([method, task, ratio, f"{value:.2f}"])
    plot_accuracy(rows, out / "leaderboard.png", "task-averaged accuracy under KV pruning")
    models = sorted({r["model"] for r in rows})
    counts = defaultdict(set)
    for row in rows:
        counts[row["task"]].add(row["item"])
    text = ["# Leaderboard", "", f"Model(s): {', '.join(models)}. Items per task: "
            + ", ".join(f"{t} {len(v)}" for t, v in sorted(counts.items())) + ".", "",
            "![accuracy against kept fraction](leaderboard.png)", "", summary_markdown(rows),
            "## Allocation ablation (same scorer, different allocators)", "", allocation_ablation_markdown(rows)]
    official = [r for r in rows if "score_official" in r]
    if official:
        text += ["## SCBench under the official scorers (sensitivity; the tables above use the revised scorers)", "",
                 summary_markdown(official, "score_official")]
    path = out / "leaderboard.md"
    path.write_text("\n".join(text))
    return path

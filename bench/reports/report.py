"""Tables and figures from result rows: the compare summary, ``bench leaderboard``, curves with interval bands.

Rows are only ever averaged within one setting group (model, weights, profile, length, code version): a store that
holds several groups gets one section per group. Every number comes with a 95 % paired-bootstrap interval over
items (:mod:`bench.reports.stats`); a difference whose interval contains 0 is reported as a tie.
"""

from __future__ import annotations

import textwrap
from collections import defaultdict
from pathlib import Path

from artifacts.files import atomic_path, rebuilt_path, write_rebuilt
from artifacts.outputs import DERIVED, FILE, Output

from ..store.row_fields import BASELINE, GROUP_FIELDS, method_of
from .markdown_text import escaped
from .needle_table import needle_markdown
from .stats import PairedBootstrap, shown

ACCURACY_FLOOR = 0.10
"""Tasks where no prune answers fewer than this fraction right are left out of the accuracy average."""
RESAMPLES = 1000
PAIRWISE_KEEP_FRACTIONS = (0.02, 0.05, 0.1, 0.2)
METRICS = {"score": ("accuracy (%)", 100.0, 1), "delta_nll": ("ΔNLL (nats per answer, child − full cache)", 1.0, 3)}


def group_rows(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Rows by setting group (:data:`bench.store.row_fields.GROUP_FIELDS`), in a stable order."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[tuple(row.get(f) for f in GROUP_FIELDS)].append(row)
    return dict(sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])))


def group_title(key: tuple, with_code: bool = True) -> str:
    """The group's heading; settings at their defaults (HF engine, float32 on CPU; artifacts that rows from before
    them do not record) are left out of it, so that headings of older stores read as they did. Without its code
    (``with_code`` False), as a published image is titled: a carry moves the code, not one value drawn, and the
    image stays as committed (the heading above it names the code)."""
    group = dict(zip(GROUP_FIELDS, key))
    fingerprints = f"weights {group['weights']}"
    if group.get("artifacts"):
        fingerprints += f", artifacts {group['artifacts']}"
    shown = [f"{field} {group[field]}" for field, default in (("engine", "hf"), ("dtype", "float32"), ("device", "cpu"))
             if group.get(field) not in (None, default)]  # rows built outside a store may lack them
    return " · ".join([f"{group['model']} ({fingerprints})", f"profile {group['profile']}",
                       f"{group['length']} tokens", *([f"code {group['code']}"] if with_code else []), *shown])


class GroupReport:
    """The bootstraps of one setting group, and which tasks enter which average."""

    def __init__(self, rows: list[dict], resamples: int = RESAMPLES, seed: int = 0):
        self.rows = rows
        self.boot = {field: PairedBootstrap(rows, field, resamples, seed) for field in METRICS}
        accuracy = self.boot["score"]
        self.methods = sorted({m for m, _ in accuracy.cells if m != BASELINE})
        self.parts = {method_of(row): (row["press"], row["allocator"]) for row in rows if row["press"] != BASELINE}
        """``{method: (press, allocator)}``, as the rows name them."""
        self.keep_fractions = sorted({r for m, r in accuracy.cells if m != BASELINE})
        # a task enters an average only if every method ran it (like for like)
        self.tasks = [t for t in accuracy.tasks
                      if all(accuracy.has(m, r, t)
                             for m in self.methods for r in self.keep_fractions if self._ran(m, r))
                      and accuracy.has(BASELINE, 1.0, t)] if accuracy.has_baseline() else list(accuracy.tasks)
        floor = {t: accuracy.cell(BASELINE, 1.0, t).mean for t in self.tasks} if accuracy.has_baseline() else {}
        self.floored = [t for t in self.tasks if floor.get(t, 1.0) < ACCURACY_FLOOR]
        self.average_tasks = {"score": [t for t in self.tasks if t not in self.floored],
                              "delta_nll": list(self.tasks)}

    def _ran(self, method: str, p: float) -> bool:
        return any(self.boot["score"].has(method, p, t) for t in self.boot["score"].tasks)

    def columns(self, method: str) -> list[float]:
        return [r for r in self.keep_fractions if self._ran(method, r)]

    def items_line(self) -> str:
        """How many items each task has; where the rows' contexts were drawn with several ``--seed``, which (their
        items are pooled: each is paired across methods within its own context)."""
        counts = ", ".join(f"{t} {self.boot['score'].n_items(t)}" for t in self.boot["score"].tasks)
        seeds = sorted({row["seed"] for row in self.rows if row.get("seed") is not None})
        drawn = f" (contexts drawn with seeds {', '.join(map(str, seeds))}, pooled)" if len(seeds) > 1 else ""
        return f"Items per task: {counts}{drawn}."

    def averages_markdown(self, field: str) -> list[str]:
        label, scale, digits = METRICS[field]
        boot, tasks = self.boot[field], self.average_tasks[field]
        lines = [f"### Task-averaged {label}, 95 % paired-bootstrap interval", ""]
        if not tasks:
            return lines + ["No task qualifies for this average.", ""]
        lines.append(f"Averaged over {len(tasks)} task(s): {', '.join(tasks)}.")
        if field == "score" and self.floored:
            lines.append(f"Left out (no prune below {ACCURACY_FLOOR:.0%}): {', '.join(self.floored)}; "
                         "they stay in the ΔNLL average.")
        headers = [f"p={r:g}" for r in self.keep_fractions] or ["full cache"]
        lines += ["", "| method | " + " | ".join(headers) + " |", "|---|" + "---|" * len(headers)]
        if boot.has_baseline():
            base = boot.average(BASELINE, 1.0, tasks).format(scale, digits)
            lines.append("| no prune | " + " | ".join(base for _ in headers) + " |")
        for method in self.methods:
            cells = [boot.average(method, r, tasks).format(scale, digits) if self._ran(method, r) else "–"
                     for r in self.keep_fractions]
            lines.append(f"| {escaped(method)} | " + " | ".join(cells) + " |")
        return lines + [""]

    def pairwise_markdown(self, field: str, p: float) -> list[str]:
        """Row method − column method at ``p``, paired; ▲ row better, ▼ row worse, = tie (interval holds 0)."""
        label, scale, digits = METRICS[field]
        boot, tasks = self.boot[field], self.average_tasks[field]
        methods = [m for m in self.methods if self._ran(m, p)] + ([BASELINE] if boot.has_baseline() else [])
        if len(methods) < 2 or not tasks:
            return []
        higher_is_better = field == "score"
        lines = [f"#### p = {p:g}: {label}, row − column", "",
                 "| | " + " | ".join(_shown(m) for m in methods) + " |",
                 "|---|" + "---|" * len(methods)]
        for a in methods:
            cells = []
            for b in methods:
                if a == b:
                    cells.append("")
                    continue
                diff = boot.difference(a, p, b, p, tasks)
                mark = "=" if not diff.excludes_zero() else ("▲" if (diff.mean > 0) == higher_is_better else "▼")
                cells.append(f"{mark} {diff.format(scale, digits)}")
            lines.append(f"| {_shown(a)} | " + " | ".join(cells) + " |")
        return lines + [""]

    def per_task_markdown(self, method: str) -> list[str]:
        keep_fractions = self.columns(method)
        lines = [f"### {escaped(method)}: per task, accuracy (%) and ΔNLL", "",
                 "| task | no prune | " + " | ".join(f"p={r:g}" for r in keep_fractions) + " |",
                 "|---|---|" + "---|" * len(keep_fractions)]
        accuracy, nll = self.boot["score"], self.boot["delta_nll"]
        for task in accuracy.tasks:
            base = accuracy.cell(BASELINE, 1.0, task).format(100, 0) if accuracy.has(BASELINE, 1.0, task) else "–"
            cells = []
            for r in keep_fractions:
                if not accuracy.has(method, r, task):
                    cells.append("–")
                    continue
                cell = accuracy.cell(method, r, task).format(100, 0)
                if task in nll.tasks and nll.has(method, r, task):
                    cell += f"; {shown(nll.cell(method, r, task).mean, 2)}"
                cells.append(cell)
            lines.append(f"| {task} | {base} | " + " | ".join(cells) + " |")
        return lines + [""]

    def headline_markdown(self) -> str:
        """The averages of both metrics alone (what ``bench compare`` prints; the rest is in ``summary.md``)."""
        return "\n".join([self.items_line(), ""]
                         + [line for field in METRICS for line in self.averages_markdown(field)])

    def markdown(self, pairwise_keep_fractions=None, per_task: bool = True) -> str:
        keep_fractions = [r for r in self.keep_fractions
                          if pairwise_keep_fractions is None or r in pairwise_keep_fractions]
        lines = [self.items_line(), ""]
        for field in METRICS:
            lines += self.averages_markdown(field)
        if keep_fractions:
            lines += ["### Pairwise differences (▲ row better, ▼ row worse, = indistinguishable: "
                      "the interval holds 0)", ""]
            for p in keep_fractions:
                for field in METRICS:
                    lines += self.pairwise_markdown(field, p)
        if per_task:
            lines.append("Per-task cells: accuracy (%) [interval]; mean ΔNLL.\n")
            for method in self.methods:
                lines += self.per_task_markdown(method)
        return "\n".join(lines)


def _shown(method: str) -> str:
    """A method as a Markdown table names it: ``no prune``, or its label as it is (:func:`escaped`)."""
    return "no prune" if method == BASELINE else escaped(method)


def summary_markdown(rows: list[dict], pairwise_keep_fractions=None, resamples: int = RESAMPLES) -> str:
    """One section per setting group: averages with intervals, pairwise tables, per-task cells, and the needle
    recall of NIAH rows (:func:`bench.reports.needle_table.needle_markdown`) where they have it."""
    sections = []
    for key, group in group_rows(rows).items():
        sections += [f"## {group_title(key)}", "", GroupReport(group, resamples).markdown(pairwise_keep_fractions)]
        needles = needle_markdown(group)
        if needles:
            sections += [needles]
    return "\n".join(sections) + "\n"


def headline_markdown(rows: list[dict], resamples: int = RESAMPLES) -> str:
    """Per setting group: the task-averaged accuracy and ΔNLL with intervals, and the needle recall over all layers."""
    sections = []
    for key, group in group_rows(rows).items():
        sections += [f"## {group_title(key)}", "", GroupReport(group, resamples).headline_markdown()]
        needles = needle_markdown(group, per_layer=False)
        if needles:
            sections += [needles]
    return "\n".join(sections) + "\n"


REPORTS = ("summary.md", "curves.png")
"""What ``bench compare`` writes beside a store's results.jsonl (:func:`write_reports`)."""


def report_outputs(out: Path) -> list[Output]:
    """Where :func:`write_reports` writes (each report and the hash :func:`~artifacts.files.rebuilt_path` keeps of
    it), as a command declares its outputs: a folder or a pipe there is refused before any work (a pipe would be read
    forever once the work is done)."""
    return [Output(Path(out) / record, "--out", kind=FILE, keeps=DERIVED, within=Path(out))
            for name in REPORTS for record in (name, f".{name}.sha256")]  # each report and its hash record


def write_reports(out: Path, rows: list[dict], title: str) -> Path:
    """``out``'s :data:`REPORTS` of ``rows``: the summary (:func:`summary_markdown`) and the curves
    (:func:`plot_curves`, headed ``title``), each rebuilt whole (:func:`artifacts.files.rebuilt_path`); returns the
    plot's path."""
    summary, png = (Path(out) / name for name in REPORTS)
    write_rebuilt(summary, summary_markdown(rows))
    with rebuilt_path(png) as scratch:
        plot_curves(rows, scratch, title)
    return png


def plot_curves(rows: list[dict], path: Path, title: str = "", resamples: int = RESAMPLES) -> Path:
    """Task-averaged accuracy and ΔNLL against kept fraction with 95 % bands, one line per method (one setting
    group). A single kept fraction is drawn as points with error bars, one per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    groups = group_rows(rows)
    if len(groups) != 1:
        raise ValueError(f"a plot shows one setting group; these rows hold {len(groups)}: "
                         + "; ".join(group_title(k) for k in groups))
    report = GroupReport(next(iter(groups.values())), resamples)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), dpi=120)
    presses_seen = sorted({report.parts[m][0] for m in report.methods})
    # colour by press, line style by allocator, both by first appearance: a new press or allocator needs no entry
    styles = ("-", "--", ":", "-.", (0, (5, 1)), (0, (1, 3)), (0, (3, 1, 1, 1)))
    allocators_seen = sorted({report.parts[m][1] for m in report.methods})
    single = len(report.keep_fractions) == 1
    for ax, field in zip(axes, METRICS):
        label, scale, _ = METRICS[field]
        boot, tasks = report.boot[field], report.average_tasks[field]
        if not tasks:
            ax.set_title(f"{label}: no task qualifies")
            continue
        for k, method in enumerate(report.methods):
            press, alloc = report.parts[method]
            colour = plt.cm.tab10(presses_seen.index(press) % 10)
            xs = report.columns(method)
            stats = [boot.average(method, r, tasks) for r in xs]
            ys = [s.mean * scale for s in stats]
            low, high = [s.low * scale for s in stats], [s.high * scale for s in stats]
            if single:
                ax.errorbar([k], ys, yerr=[[ys[0] - low[0]], [high[0] - ys[0]]], fmt="o", color=colour,
                            capsize=3, label=method)
            else:
                ax.plot(xs, ys, marker="o", markersize=3, label=method, color=colour,
                        linestyle=styles[allocators_seen.index(alloc) % len(styles)])
                ax.fill_between(xs, low, high, color=colour, alpha=0.12)
        if boot.has_baseline():
            base = boot.average(BASELINE, 1.0, tasks)
            ax.axhline(base.mean * scale, color="black", linestyle="--", label="no prune")
            ax.axhspan(base.low * scale, base.high * scale, color="black", alpha=0.06)
        if single:
            ax.set_xticks(range(len(report.methods)), report.methods, rotation=30, ha="right", fontsize=7)
            ax.set_xlabel(f"method at kept fraction p = {report.keep_fractions[0]:g}")
        else:
            ax.set_xscale("log")
            ax.set_xticks(report.keep_fractions, [f"{r:g}" for r in report.keep_fractions], fontsize=7)
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_xlabel("kept fraction p of the attention KV cache (log scale)")
        if field == "score":
            ax.set_ylim(bottom=max(0.0, ax.get_ylim()[0]), top=min(100.0, ax.get_ylim()[1]) + 2)
        ax.set_ylabel(f"task-averaged {label.split(' (')[0]}" + (" (%)" if field == "score" else " (nats per answer)"))
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.suptitle("\n".join(textwrap.wrap(title, 150)), fontsize=9)  # wrapped: a long title stays on the image
    fig.tight_layout()
    with atomic_path(path) as scratch:
        fig.savefig(scratch, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
    return path

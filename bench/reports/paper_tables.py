"""The paper's two comparison tables, in its shapes, from the rows of one setting group.

- Table 3: GateSight with its gate-proportional allocation against KVzip with its global selection, at kept
  fractions 0.7 / 0.4 / 0.1 and averaged over every kept fraction both ran, per benchmark.
- Table 4: the allocation ablation — GateSight's scores under the gate, flat and PyramidKV budgets at one total.

A benchmark is the tasks of one haystack: the generated one, or a real-text source (tasks named ``task@source``).
Every cell is a task average with its 95 % paired-bootstrap interval; every difference is paired, marked ▲ / ▼ when
its interval excludes 0 and = (a tie) when it does not.
"""

from __future__ import annotations

from ..store.row_fields import BASELINE
from .markdown_text import escaped
from .report import METRICS, GroupReport

GATESIGHT, KVZIP = "gatesight/gate", "kvzip/global"
TABLE3_FRACTIONS = (0.7, 0.4, 0.1, 0.05)
"""The paper's three columns, and p = 0.05 where a group ran it (the low-budget end of the hybrids' targets)."""
ABLATION = ("gatesight/gate", "gatesight/flat", "gatesight/pyramid")


def benchmarks(tasks: list[str]) -> dict[str, list[str]]:
    """Tasks by haystack: ``generated`` first, then each real-text source."""
    out: dict[str, list[str]] = {}
    for task in sorted(tasks, key=lambda t: ("@" in t, t)):
        out.setdefault(task.partition("@")[2] or "generated", []).append(task)
    return out


def _mark(diff, higher_is_better: bool) -> str:
    if not diff.excludes_zero():
        return "="
    return "▲" if (diff.mean > 0) == higher_is_better else "▼"


def _name(method: str) -> str:
    return "no prune" if method == BASELINE else escaped(method)


def table3_markdown(report: GroupReport) -> list[str]:
    """GateSight (gate) against KVzip (global), both metrics, one block per benchmark; empty if either is missing."""
    if not {GATESIGHT, KVZIP} <= set(report.methods):
        return []
    shared = sorted(set(report.columns(GATESIGHT)) & set(report.columns(KVZIP)))
    shown = [p for p in TABLE3_FRACTIONS if p in shared]
    lines = ["### Table 3: GateSight (gate allocation) against KVzip (global selection)", "",
             "Columns: kept fraction p; mean = the average over every p both ran "
             f"({', '.join(f'{p:g}' for p in shared)})."
             " Difference rows: GateSight − KVzip, paired.", ""]
    for field, (label, scale, digits) in METRICS.items():
        boot, higher = report.boot[field], field == "score"
        header = "| benchmark | method | " + " | ".join(f"p={p:g}" for p in shown) + " | mean |"
        lines += [f"**{label}**", "", header, "|---|---|" + "---|" * (len(shown) + 1)]
        for bench, tasks in benchmarks(report.average_tasks[field]).items():
            n = min(boot.n_items(t) for t in tasks)
            where = f"{bench} ({len(tasks)} tasks, n ≥ {n})"
            for method in ([BASELINE] if boot.has_baseline() else []) + [GATESIGHT, KVZIP]:
                cells = [boot.average(method, p, tasks).format(scale, digits) for p in shown]
                cells.append(boot.mean_over_fractions(method, shared, tasks).format(scale, digits))
                lines.append(f"| {where} | {_name(method)} | " + " | ".join(cells) + " |")
                where = ""
            diffs = [boot.difference(GATESIGHT, p, KVZIP, p, tasks) for p in shown]
            diffs.append(boot.difference_over_fractions(GATESIGHT, KVZIP, shared, tasks))
            lines.append("| | GateSight − KVzip | " + " | ".join(f"{_mark(d, higher)} {d.format(scale, digits)}"
                                                             for d in diffs) + " |")
        lines.append("")
    return lines


def table4_markdown(report: GroupReport) -> list[str]:
    """GateSight's scores under gate, flat and pyramid budgets (the same total), with gate − each other allocator,
    both metrics, one block per benchmark; empty unless all three ran."""
    if not set(ABLATION) <= set(report.methods):
        return []
    fractions = sorted(set.intersection(*(set(report.columns(m)) for m in ABLATION)))
    lines = ["### Table 4: allocation ablation — GateSight's scores under three budget rules at one total", "",
             "Difference rows: gate − the other allocator, paired, at each p and averaged over them.", ""]
    for field, (label, scale, digits) in METRICS.items():
        boot, higher = report.boot[field], field == "score"
        lines += [f"**{label}**", "",
                  "| benchmark | allocation | " + " | ".join(f"p={p:g}" for p in fractions) + " | mean |",
                  "|---|---|" + "---|" * (len(fractions) + 1)]
        for bench, tasks in benchmarks(report.average_tasks[field]).items():
            where = f"{bench} ({len(tasks)} tasks)"
            for method in ABLATION:
                cells = [boot.average(method, p, tasks).format(scale, digits) for p in fractions]
                cells.append(boot.mean_over_fractions(method, fractions, tasks).format(scale, digits))
                lines.append(f"| {where} | {escaped(report.parts[method][1])} | " + " | ".join(cells) + " |")
                where = ""
            for other in ABLATION[1:]:
                diffs = [boot.difference(ABLATION[0], p, other, p, tasks) for p in fractions]
                diffs.append(boot.difference_over_fractions(ABLATION[0], other, fractions, tasks))
                lines.append(f"| | gate − {escaped(report.parts[other][1])} | "
                             + " | ".join(f"{_mark(d, higher)} {d.format(scale, digits)}" for d in diffs) + " |")
        lines.append("")
    return lines

"""``leaderboard.html``: the leaderboard as one self-contained page a person explores.

A person picks a setting group, a set of tasks and the methods, and sees task-averaged accuracy and ΔNLL against the
kept fraction p with their 95 % bands, the numbers under them, and the group's Tables 3 and 4, needle recall and
cost. Every number on the page is computed here, once, by the leaderboard's own statistics
(:class:`bench.reports.report.GroupReport`), rounded as the Markdown rounds it and embedded as JSON; the page's script
only draws them and never derives a statistic. The sets of tasks it offers are those an interval exists for: the
leaderboard's own average, each haystack's tasks (the paper's benchmarks, :func:`bench.reports.paper_tables.benchmarks`)
and each task alone — an average over any other subset would need its own bootstrap.

The page is one file with no network at all: its style, script and data are inline, and it draws with inline SVG.
The same rows give the same bytes, so ``leaderboard.sha256`` lists it and ``bench verify --docs`` checks it to the
byte like the Markdown.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path

from artifacts.files import write_text

from ..store.row_fields import BASELINE
from .markdown_text import unescaped
from .paper_tables import benchmarks
from .report import ACCURACY_FLOOR, METRICS, GroupReport
from .stats import Interval

PAGE = "leaderboard.html"
TEMPLATE = "leaderboard_page.html"
"""The page's HTML, style and script (package data of :mod:`bench`); ``/*DATA*/`` stands where the data goes."""
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
"""Matplotlib's tab10, as the PNG colours presses: one colour per press, by its place among the group's presses."""
DASHES = ("", "7 3", "2 3", "7 3 2 3", "12 3", "1 5", "4 2 1 2")
"""SVG dash patterns, one per allocator (the PNG's line styles)."""
ALL_TASKS = "every task (the leaderboard's average)"


def _triple(interval: Interval, scale: float, digits: int) -> list[float | None]:
    """``[mean, low, high]`` scaled and rounded exactly as :meth:`bench.reports.stats.Interval.format` prints them (so
    the page shows the Markdown's digits); None for a bound no resample has."""
    return [None if math.isnan(v) else float(f"{v * scale:.{digits}f}")
            for v in (interval.mean, interval.low, interval.high)]


def task_sets(report: GroupReport) -> list[tuple[str, dict[str, list[str]]]]:
    """The choices of tasks the page offers, each as ``(name, {metric: the tasks averaged})``.

    The leaderboard's average first (accuracy without the floored tasks, as the Markdown averages it), then each
    haystack's share of those tasks where the group has more than one haystack, then each task alone.
    """
    choices = [(ALL_TASKS, {field: list(report.average_tasks[field]) for field in METRICS})]
    by_haystack = {field: benchmarks(report.average_tasks[field]) for field in METRICS}
    haystacks = sorted(set().union(*by_haystack.values()), key=lambda h: (h != "generated", h))
    if len(haystacks) > 1:
        choices += [(f"{haystack} haystack", {field: by_haystack[field].get(haystack, []) for field in METRICS})
                    for haystack in haystacks]
    every = sorted(set().union(*(report.boot[field].tasks for field in METRICS)), key=lambda t: ("@" in t, t))
    choices += [(task, {field: [task] if task in report.boot[field].tasks else [] for field in METRICS})
                for task in every]
    return choices


def _curves(report: GroupReport, field: str, tasks: list[str]) -> dict:
    """``{"base": [mean, low, high] or None, "curves": {method: [[p, mean, low, high], ...]}}`` of one metric
    averaged over ``tasks`` (a method's point at p only where it ran every one of them)."""
    _, scale, digits = METRICS[field]
    boot = report.boot[field]
    if not tasks:
        return {"base": None, "curves": {}}
    base = (_triple(boot.average(BASELINE, 1.0, tasks), scale, digits)
            if boot.has_baseline() and all(boot.has(BASELINE, 1.0, t) for t in tasks) else None)
    curves = {}
    for method in report.methods:
        points = [[p, *_triple(boot.average(method, p, tasks), scale, digits)] for p in report.columns(method)
                  if all(boot.has(method, p, t) for t in tasks)]
        if points:
            curves[method] = points
    return {"base": base, "curves": curves}


def _blocks(lines: list[str]) -> list[list]:
    """Markdown lines of the leaderboard's tables as ``[kind, content]`` blocks for the page to lay out:
    ``h`` (a heading), ``b`` (a bold label), ``p`` (a paragraph) and ``table`` (rows of cells, the header first)."""
    blocks: list[list] = []
    for line in (line.strip() for line in lines):
        if line.startswith("|---"):
            continue
        if line.startswith("|"):
            cells = [unescaped(cell.strip()) for cell in line.strip("|").split("|")]
            if blocks and blocks[-1][0] == "table":
                blocks[-1][1].append(cells)
            else:
                blocks.append(["table", [cells]])
        elif line.startswith("#"):
            blocks.append(["h", unescaped(line.lstrip("#").strip())])
        elif line.startswith("**") and line.endswith("**"):
            blocks.append(["b", unescaped(line.strip("*"))])
        elif line:
            blocks.append(["p", unescaped(line)])
    return blocks


def group_data(title: str, report: GroupReport, tables: list[str]) -> dict:
    """What the page shows of one setting group: its title, its methods (colour and dash as the PNG styles
    them), its kept fractions, the curves of every :func:`task_sets` choice and ``tables`` (the leaderboard's
    Markdown of the group's Tables 3 and 4, needle recall and cost) as :func:`_blocks`."""
    presses = sorted({report.parts[m][0] for m in report.methods})
    allocators = sorted({report.parts[m][1] for m in report.methods})
    methods = [{"name": m, "colour": PALETTE[presses.index(report.parts[m][0]) % len(PALETTE)],
                "dash": DASHES[allocators.index(report.parts[m][1]) % len(DASHES)]} for m in report.methods]
    floored = ("Accuracy leaves out the tasks where no prune is below "
               f"{ACCURACY_FLOOR:.0%}: {', '.join(report.floored)}.") if report.floored else ""
    sets = [{"name": name, "tasks": tasks, **{field: _curves(report, field, tasks[field]) for field in METRICS}}
            for name, tasks in task_sets(report)]
    return {"title": title, "items": report.items_line(), "floored": floored, "fractions": report.keep_fractions,
            "methods": methods, "sets": sets, "tables": _blocks(tables)}


def page_html(groups: list[dict], note: str, resamples: int) -> str:
    """The page: the template with ``groups`` (:func:`group_data`) embedded as JSON, one group a line.

    ``<`` is written as its JSON escape, so that no value (a method's name) can close the script element it is in.
    """
    metrics = {field: {"label": label, "digits": digits} for field, (label, _, digits) in METRICS.items()}
    head = json.dumps({"note": note, "resamples": resamples, "metrics": metrics}, ensure_ascii=False)
    body = ",\n".join(json.dumps(group, ensure_ascii=False, allow_nan=False) for group in groups)
    data = f'{head[:-1]}, "groups": [\n{body}\n]}}'.replace("<", "\\u003c")
    template = resources.files("bench.reports").joinpath(TEMPLATE).read_text(encoding="utf-8")
    return template.replace("/*DATA*/", data, 1)


def write_page(path: Path, groups: list[dict], note: str, resamples: int) -> Path:
    """:func:`page_html` written atomically at ``path``."""
    return write_text(path, page_html(groups, note, resamples))

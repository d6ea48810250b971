"""``bench leaderboard``: the published tables and figures of one or more result stores.

Per setting group: the curves, the averages with intervals, pairwise tables, per-task cells, the paper's Tables 3
and 4 (:mod:`bench.reports.paper_tables`), the needle recall of the NIAH tasks, each scorer's time as a share of prefill
(:mod:`bench.reports.scoring_cost`) and every scorer under every allocator it ran with; a CSV of every cell; the same
numbers on one self-contained page to explore (``leaderboard.html``, :mod:`bench.reports.leaderboard_page`); and
``leaderboard.sha256``, the SHA-256 of every file written (``sha256sum -c`` reads it), by which ``bench verify``
knows the images drawn with these tables.
"""

from __future__ import annotations

import csv
import fcntl
import hashlib
import io
import os
import re
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from artifacts.files import INSTALLED, write_text
from runtime import signals
from runtime.bounded_read import METADATA_LIMIT, REPORT_LIMIT, read_bounded, read_text_bounded
from runtime.errors import UsageError

from ..store.result_store import open_stores
from ..store.store_checks import check_stores
from .leaderboard_page import PAGE, group_data, write_page
from .markdown_text import escaped
from .paper_tables import table3_markdown, table4_markdown
from .report import (
    ACCURACY_FLOOR,
    PAIRWISE_KEEP_FRACTIONS,
    RESAMPLES,
    GroupReport,
    group_rows,
    group_title,
    plot_curves,
    summary_markdown,
)
from .scoring_cost import scoring_cost_markdown
from .stats import PairedBootstrap, shown

MARKDOWN = "leaderboard.md"
CELLS = "leaderboard.csv"
IMAGE = "leaderboard.png"
"""The first setting group's image (the others: ``leaderboard-2.png``, …)."""
MANIFEST = "leaderboard.sha256"
"""Beside the leaderboard: ``<sha256>  <file>`` for every file it wrote, in ``sha256sum``'s format."""
PUBLISHED = re.compile(r"leaderboard(-[^/]*)?\.(csv|png|html)")
"""The names of a leaderboard's tables and images (``leaderboard-2.png``, …): the only files a new build removes
(those its manifest listed and it no longer writes), and those ``bench verify --docs`` refuses unlisted."""
REBUILD_REMEDY = "move it aside, then run `bench leaderboard` again"
"""What a user does about a published file or manifest too large to be one a leaderboard wrote."""
SCRATCH_PREFIX = ".leaderboard-build-"
"""A build's scratch folder in ``--out``, renamed into place file by file at its end."""


def sha256_of(path: Path) -> str:
    """The SHA-256 (hex) of a file a leaderboard publishes, read within :data:`~runtime.bounded_read.REPORT_LIMIT`."""
    return hashlib.sha256(read_bounded(Path(path), REPORT_LIMIT, REBUILD_REMEDY)).hexdigest()


def read_manifest(path: Path) -> dict[str, str]:
    """``{file name: sha256}`` of a :data:`MANIFEST`; ``ValueError`` naming it if it is missing or malformed."""
    if not path.is_file():
        raise UsageError(f"{path} is missing: bench leaderboard writes it beside the files it publishes; run "
                         "`bench leaderboard` again")
    digests = {}
    for number, line in enumerate(read_text_bounded(path, METADATA_LIMIT, REBUILD_REMEDY).splitlines(), start=1):
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or not name:
            raise UsageError(f"{path}:{number}: expected '<sha256>  <file name>', got {line!r}; run `bench "
                             "leaderboard` again")
        digests[name] = digest
    return digests


def allocation_ablation_markdown(report: GroupReport) -> list[str]:
    """The paper's Table 4 analogue: each scorer under every allocator it ran with (ΔNLL, task-averaged)."""
    by_press: dict[str, list[tuple[str, str]]] = defaultdict(list)  # press -> (allocator, method)
    for method in report.methods:
        press, alloc = report.parts[method]
        by_press[press].append((alloc, method))
    boot, tasks = report.boot["delta_nll"], report.average_tasks["delta_nll"]
    lines = ["| press | allocator | " + " | ".join(f"p={r:g}" for r in report.keep_fractions) + " |",
             "|---|---|" + "---|" * len(report.keep_fractions)]
    for press in sorted(by_press):
        if len(by_press[press]) < 2:
            continue
        for alloc, method in sorted(by_press[press]):
            cells = [boot.average(method, r, tasks).format(1, 3) if r in report.columns(method) else "–"
                     for r in report.keep_fractions]
            lines.append(f"| {escaped(press)} | {escaped(alloc)} | " + " | ".join(cells) + " |")
    return lines if len(lines) > 2 else []


def needle_recall_markdown(rows: list[dict], resamples: int = RESAMPLES) -> list[str]:
    """Needle recall beside accuracy: the share of the answers' tokens a child keeps, over every attention layer
    and KV head (the rows' ``answer_recall``, :mod:`bench.run.rows`), averaged over the NIAH tasks, each cell with its
    paired bootstrap interval over items; empty for a group without NIAH rows (no-prune rows carry none)."""
    if not any(row.get("answer_recall") is not None for row in rows):
        return []
    boot = PairedBootstrap(rows, "answer_recall", resamples)
    fractions = sorted({p for _, p in boot.cells}, reverse=True)
    lines = ["### Needle recall: answer tokens kept (%), every attention layer and KV head", "",
             f"Tasks: {', '.join(boot.tasks)} (n ≥ {min(boot.n_items(t) for t in boot.tasks)} each); the same items "
             "as the accuracy above.", "",
             "| method | " + " | ".join(f"p={p:g}" for p in fractions) + " |", "|---|" + "---|" * len(fractions)]
    for method in sorted({m for m, _ in boot.cells}):
        cells = [boot.average(method, p, boot.tasks).format(100, 0)
                 if all(boot.has(method, p, t) for t in boot.tasks) else "–" for p in fractions]
        lines.append(f"| {escaped(method)} | " + " | ".join(cells) + " |")
    return lines + [""]


def write_leaderboard(stores: list[Path], out: Path, resamples: int = RESAMPLES, published: bool = True) -> Path:
    """``leaderboard.md``, ``leaderboard.csv``, one PNG per setting group, the page :data:`PAGE` and their
    :data:`MANIFEST`, from one or more result stores; returns the path of ``leaderboard.md``.

    Everything is built in a scratch folder in ``out``, then moved in at once (a stop cannot leave one build's image
    beside another's tables); one build writes ``out`` at a time. ``published``: ``out`` is the user's (a stop
    after the move says it holds the new leaderboard), not a rebuild to compare with (``bench verify --docs``)."""
    opened = open_stores(stores)
    # a report never shows a NaN as a blank cell, nor a fraction above 1, nor stops on a value that is not a number;
    # nor a section of an unfinished run, nor the mean of two rows that contradict each other, nor a row counted twice
    check_stores(opened)
    rows = [row for store in opened for row in store.rows]
    if not rows:
        raise UsageError(f"no results in {', '.join(map(str, stores))}: run `bench compare` first")
    out.mkdir(parents=True, exist_ok=True)
    with _sole_builder(out), _scratch(out) as scratch:
        built = _build(rows, Path(scratch), resamples)
        manifest = write_text(Path(scratch) / MANIFEST, "".join(f"{sha256_of(path)}  {path.name}\n"
                                                                for path in built))
        earlier = _listed(out / MANIFEST)
        with signals.held():
            for path in [*built, manifest]:
                os.replace(path, out / path.name)
            for name in sorted(earlier - {path.name for path in built}):  # a group this build does not have
                (out / name).unlink(missing_ok=True)
            if published:
                INSTALLED.append(f"{out} holds the new leaderboard")
    return out / MARKDOWN


def _build(rows: list[dict], out: Path, resamples: int) -> list[Path]:
    """The leaderboard's markdown, CSV, images and page of ``rows``, written in ``out``."""
    table = io.StringIO(newline="")
    note = ("Every cell: mean [95 % paired-bootstrap interval over items, "
            f"{resamples} resamples]. ΔNLL = answer NLL of the compacted cache − the full cache's, teacher-forced on "
            "the reference answer (lower is better; 0 = no change). Accuracy averages leave out tasks where no "
            f"prune is below {ACCURACY_FLOOR:.0%}.")
    text, page = ["# Leaderboard", "", note, ""], []
    writer = csv.writer(table)
    writer.writerow(["group", "method", "task", "keep_fraction", "items", "metric", "mean", "low", "high"])
    images = []
    for number, (key, group) in enumerate(group_rows(rows).items(), start=1):
        report = GroupReport(group, resamples)
        png = IMAGE if number == 1 else f"leaderboard-{number}.png"
        images.append(plot_curves(group, out / png, group_title(key, with_code=False), resamples))
        text += [f"## {group_title(key)}", "", f"![task-averaged accuracy and ΔNLL against kept fraction]({png})",
                 "", report.markdown(PAIRWISE_KEEP_FRACTIONS)]
        tables = table3_markdown(report) + table4_markdown(report) + needle_recall_markdown(group, resamples)
        tables += scoring_cost_markdown(group, resamples)
        ablation = allocation_ablation_markdown(report)
        if ablation:
            tables += ["### Every scorer under every allocator it ran with: ΔNLL", "", *ablation, ""]
        text += tables
        page.append(group_data(group_title(key), report, tables))
        for field, boot in report.boot.items():
            for method, p in boot.cells:
                for task in boot.tasks:
                    if boot.has(method, p, task):
                        c = boot.cell(method, p, task)
                        writer.writerow([number, method, task, p, boot.n_items(task), field,
                                         *(shown(value, 4) for value in (c.mean, c.low, c.high))])
    official = [r for r in rows if "score_official" in r]
    if official:
        text += ["## SCBench under the official scorers (sensitivity; the tables above use the revised scorers)", "",
                 summary_markdown([{**r, "score": r["score_official"]} for r in official], resamples=resamples)]
    return [write_text(out / MARKDOWN, "\n".join(text)), write_text(out / CELLS, table.getvalue()), *images,
            write_page(out / PAGE, page, note, resamples)]


@contextmanager
def _sole_builder(out: Path) -> Iterator[None]:
    """A lock on the folder ``out`` itself (no file of its own) while a build writes it: a second build into it at
    once is refused, instead of the two mixing their files."""
    folder = os.open(out, os.O_RDONLY)
    try:
        try:
            fcntl.flock(folder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"--out {out}: another bench leaderboard is writing there now; wait for it to finish, "
                             "or give another --out") from None
        yield
    finally:
        os.close(folder)  # releases the lock


@contextmanager
def _scratch(out: Path) -> Iterator[str]:
    """A scratch folder in ``out`` for one build (the caller holds :func:`_sole_builder`'s lock): the scratch folders
    of builds killed before they cleaned up are removed first, none of them being written now."""
    for stale in out.glob(f"{SCRATCH_PREFIX}*"):
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=SCRATCH_PREFIX) as scratch:
        yield scratch


def recorded_digests(manifest: Path) -> dict[str, str]:
    """``{file name: sha256}`` of an earlier build's :data:`MANIFEST`; empty if there is none or it is unreadable."""
    try:
        return read_manifest(manifest)
    except UsageError:
        return {}


def _listed(manifest: Path) -> set[str]:
    """The files of an earlier build that its :data:`MANIFEST` lists, by the names a leaderboard publishes
    (:data:`PUBLISHED`; a manifest edited to name any other file names nothing): none if there is no manifest or
    it cannot be read."""
    return {name for name in recorded_digests(manifest) if PUBLISHED.fullmatch(name)}

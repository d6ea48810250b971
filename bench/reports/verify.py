"""``bench verify``'s check of a published leaderboard: the stores pass every check, and each file the leaderboard
publishes is exactly what they rebuild (:mod:`bench.reports.leaderboard` writes it)."""

from __future__ import annotations

import difflib
import tempfile
from pathlib import Path
from typing import Callable

from artifacts.output_kinds import LEADERBOARD_PAGE, other_kind
from runtime.bounded_read import REPORT_LIMIT, read_text_bounded
from runtime.errors import UsageError, check_regular_file

from ..store.result_store import open_stores
from ..store.store_checks import check_given_once, check_stores
from .leaderboard import (
    MANIFEST,
    MARKDOWN,
    PUBLISHED,
    REBUILD_REMEDY,
    read_manifest,
    recorded_digests,
    sha256_of,
    write_leaderboard,
)

DIFF_LINES = 20
"""How much of a stale leaderboard's diff the error shows."""
DIFF_WIDTH = 300
"""How much of each line of that diff it shows (a line of the page's data holds a whole setting group)."""


def _check_docs(docs: Path) -> None:
    """``UsageError`` unless ``docs`` is a folder holding a published leaderboard (``verify --docs``)."""
    if docs.exists() and not docs.is_dir():
        what = "a file" if docs.is_file() else "not a regular file"
        raise UsageError(f"--docs {docs} is {what}, not a directory; give the directory a published leaderboard is "
                         f"in (the --out of `bench leaderboard`, holding {MARKDOWN} and {MANIFEST})")
    if not docs.is_dir():
        raise UsageError(f"--docs {docs}: no such directory; `bench leaderboard STORES --out {docs}` writes it")
    other = other_kind(docs, LEADERBOARD_PAGE)
    if other is not None:
        raise UsageError(f"--docs {docs} holds {other}, not a published leaderboard: give the folder `bench "
                         "leaderboard --out` wrote")
    for path in sorted(docs.iterdir()):  # a pipe among the published files would be read forever
        if path.name in (MARKDOWN, MANIFEST) or PUBLISHED.fullmatch(path.name):
            check_regular_file(path, "a published leaderboard file")
    if not any((docs / name).exists() for name in (MARKDOWN, MANIFEST)):
        raise UsageError(f"--docs {docs} holds no published leaderboard (neither {MARKDOWN} nor {MANIFEST}); "
                         f"`bench leaderboard STORES --out {docs}` writes it")


def verify_stores(stores: list[Path], docs: Path | None = None, report: Callable[[str], None] = print) -> None:
    """Check every row of ``stores`` as ``bench merge`` checks a shard (:func:`bench.store.store_checks.check_stores`:
    each store given once, each value of its type and range, every no-prune row with ΔNLL = KL = 0, the counts within
    the context's size, the shards of one run and split only, every run whole — every shard of it — with the rows of
    every method in every context, one value per row key) and, given ``docs``, that every file ``bench leaderboard``
    publishes there is what the stores rebuild: ``leaderboard.md`` and ``.csv`` to the byte, each image as
    ``leaderboard.sha256`` recorded it when it was drawn with those tables, and no other table or image
    (``leaderboard-*.png``, :data:`~bench.reports.leaderboard.PUBLISHED`) there.

    Parameters
    ----------
    stores : list[Path]
        Result directories written by ``bench compare``.
    docs : Path or None
        Where the published leaderboard lives; None checks the rows only.
    report : Callable[[str], None]
        Receives one line per check passed, as it passes.

    Raises
    ------
    ValueError
        A store argument that is no store or is being written (:func:`bench.store.result_store.open_stores`), a store
        given twice, no rows at all, a row that is not a valid result (by file and line), an unfinished
        store or run, a key held twice, a missing ``docs`` or one without a leaderboard, or a published file that
        is missing or differs from the rebuilt one (a text file with the start of the diff), or a table or image
        there that its manifest does not list.
    """
    if docs is not None:  # a bad --docs is named before the stores are read and checked
        _check_docs(Path(docs))
    opened = open_stores(stores)
    check_given_once(opened)
    rows = [row for store in opened for row in store.rows]
    if not rows:
        raise UsageError(f"no results in {', '.join(map(str, stores))}")
    check_stores(opened)
    report(f"{len(rows)} rows complete, every value of its type and range; every no-prune row has ΔNLL = KL = 0, "
           "every child's ΔNLL its NLL − the full cache's")
    if docs is None:
        return
    docs = Path(docs)
    with tempfile.TemporaryDirectory() as scratch:
        write_leaderboard([Path(s) for s in stores], Path(scratch), published=False)
        rebuilt = read_manifest(Path(scratch) / MANIFEST)
        for name in rebuilt:  # the tables first: a stale leaderboard shows its diff
            if not name.endswith(".png"):
                _check_text(docs / name, (Path(scratch) / name).read_text())
                report(f"{docs / name} is exactly what the store rebuilds")
    recorded = read_manifest(docs / MANIFEST)
    unlisted = sorted(path.name for path in docs.iterdir() if PUBLISHED.fullmatch(path.name) and
                      path.name not in recorded)
    if unlisted:
        raise UsageError(f"{docs / unlisted[0]} is not in {docs / MANIFEST}: it is no part of this leaderboard (left "
                         "by an earlier build, or put there by hand), and a reader would take it for one; remove it")
    texts = {name: digest for name, digest in rebuilt.items() if not name.endswith(".png")}
    if set(recorded) != set(rebuilt) or any(recorded[name] != digest for name, digest in texts.items()):
        raise UsageError(f"{docs / MANIFEST} was not written with these tables (or lists other files); run "
                         "`bench leaderboard` again")
    images = [name for name in rebuilt if name.endswith(".png")]
    for name in images:
        if not (docs / name).is_file():
            raise UsageError(f"{docs / name} is missing (the leaderboard shows it); run `bench leaderboard` again")
        if sha256_of(docs / name) != recorded[name]:
            raise UsageError(f"{docs / name} is not the image drawn with these tables (its SHA-256 differs from "
                             f"{docs / MANIFEST}: cut short or edited); run `bench leaderboard` again")
    report(f"{', '.join(str(docs / name) for name in images)}: the image(s) drawn with these tables "
           f"({docs / MANIFEST})")


def _check_text(published: Path, rebuilt: str) -> None:
    """``ValueError`` with the start of the diff unless ``published`` holds exactly ``rebuilt``; the advice is the
    one that works: a file edited by hand (which a rebuild refuses to write over) is first moved aside."""
    current = ""
    if published.exists():  # newlines as Path.read_text gives them (universal): the CSV is written with \r\n
        current = read_text_bounded(published, REPORT_LIMIT, REBUILD_REMEDY).replace("\r\n", "\n").replace("\r", "\n")
    if rebuilt != current:
        diff = "".join(line if len(line) <= DIFF_WIDTH else f"{line[:DIFF_WIDTH]} …\n" for line in list(
            difflib.unified_diff(current.splitlines(True), rebuilt.splitlines(True), str(published),
                                 "rebuilt from the store"))[:DIFF_LINES])
        edited = published.exists() and not_built_here(published) is not None
        advice = ("it was edited by hand since it was built: move it aside (keep the words you want elsewhere), then "
                  "run `bench leaderboard` again" if edited else "run `bench leaderboard` again")
        raise UsageError(f"{published} is not what the store says; {advice}:\n{diff}")


def not_built_here(path: Path) -> str | None:
    """What a file a leaderboard rebuilds is when no earlier build wrote it as it is now (its SHA-256 is not the
    one the folder's :data:`MANIFEST` records): written or edited by hand, which a rebuild would lose."""
    if recorded_digests(path.parent / MANIFEST).get(path.name) == sha256_of(path):
        return None
    return (f"{path.name} there was not written by bench leaderboard as it is now (its SHA-256 is not in "
            f"{MANIFEST}: written or edited by hand), and a leaderboard is rebuilt whole; move it, or give another "
            "--out")

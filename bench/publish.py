"""The published leaderboard: ``bench leaderboard`` writes it from result stores, ``bench verify`` checks the stores
and that the published one is exactly what they rebuild."""

from __future__ import annotations

import argparse
import difflib
import tempfile
from pathlib import Path
from typing import Callable

from .arguments import Command
from .leaderboard import write_leaderboard
from .store import ResultStore

DIFF_LINES = 20
"""How much of a stale leaderboard's diff the error shows."""


def verify_stores(stores: list[Path], docs: Path | None = None, report: Callable[[str], None] = print) -> None:
    """Check every row of ``stores`` (complete, each value of its type and range, every no-prune row with
    ΔNLL = KL = 0) and, given ``docs``, that ``docs/leaderboard.md`` is what the stores rebuild.

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
        No rows at all, a row that is not a valid result (by file and line), or a published leaderboard that differs
        from the rebuilt one (with the start of the diff).
    """
    opened = [ResultStore(directory, readonly=True) for directory in stores]
    rows = [row for store in opened for row in store.rows]
    if not rows:
        raise ValueError(f"no results in {', '.join(map(str, stores))}")
    for store in opened:
        store.check_rows()
    report(f"{len(rows)} rows complete, every value of its type and range; every no-prune row has ΔNLL = KL = 0")
    if docs is None:
        return
    published = Path(docs) / "leaderboard.md"
    with tempfile.TemporaryDirectory() as scratch:
        rebuilt = write_leaderboard([Path(s) for s in stores], Path(scratch)).read_text()
    current = published.read_text() if published.exists() else ""
    if rebuilt != current:
        diff = "".join(list(difflib.unified_diff(current.splitlines(True), rebuilt.splitlines(True), str(published),
                                                 "rebuilt from the store"))[:DIFF_LINES])
        raise ValueError(f"{published} is not what the store says; run `bench leaderboard` again:\n{diff}")
    report(f"{published} is exactly what the store rebuilds")


def add_leaderboard_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("stores", nargs="+", help="result directories written by compare")
    parser.add_argument("--out", default="docs")


def run_leaderboard(args: argparse.Namespace) -> None:
    print(write_leaderboard([Path(s) for s in args.stores], Path(args.out)))


def add_verify_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("stores", nargs="+", help="result directories written by compare")
    parser.add_argument("--docs", default=None, help="also rebuild DOCS/leaderboard.md and fail if it differs")


def run_verify(args: argparse.Namespace) -> None:
    verify_stores(args.stores, Path(args.docs) if args.docs else None)


LEADERBOARD = Command("leaderboard", "leaderboard.md, CSV and PNG from result stores", add_leaderboard_arguments,
                      run_leaderboard, loads_models=False)
VERIFY = Command("verify", "check the fidelity invariants of stores (and that a leaderboard matches them)",
                 add_verify_arguments, run_verify, loads_models=False)

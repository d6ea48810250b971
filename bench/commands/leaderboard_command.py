"""``bench leaderboard`` and ``bench verify`` on the command line: their flags, what they print, and what
``bench leaderboard --out`` may write over (a file no earlier build wrote as it is now is refused)."""

from __future__ import annotations

import argparse
from pathlib import Path

from artifacts.output_kinds import LEADERBOARD_PAGE
from artifacts.outputs import DERIVED, FILE, Output, check_name

from ..reports.leaderboard import (
    CELLS,
    IMAGE,
    MANIFEST,
    MARKDOWN,
    PAGE,
    PUBLISHED,
    write_leaderboard,
)
from ..reports.verify import not_built_here, verify_stores
from .arguments import Command


def add_leaderboard_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("stores", nargs="+", help="result directories written by compare")
    parser.add_argument("--out", default="docs", help="where leaderboard.md, .csv, .png, .html and leaderboard.sha256 "
                                                      "go: rebuilt from the stores on each run")


def run_leaderboard(args: argparse.Namespace) -> None:
    print(write_leaderboard([Path(store) for store in args.stores], Path(args.out)))


def add_verify_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("stores", nargs="+", help="result directories written by compare")
    parser.add_argument("--docs", default=None, help="also rebuild the leaderboard and fail unless every file "
                                                     "published in DOCS is what the stores rebuild")


def run_verify(args: argparse.Namespace) -> None:
    verify_stores([Path(store) for store in args.stores], Path(args.docs) if args.docs else None)


def _leaderboard_outputs(args: argparse.Namespace) -> list[Output]:
    """``--out``: rebuilt whole, but never over a file of a leaderboard's names (its markdown, tables and images,
    ``leaderboard-2.png`` among them) that no earlier build wrote as it is now."""
    out = Path(args.out)
    check_name(Output(out, "--out"))  # before the folder is looked in: a name too long fails every look
    names = [path for path in sorted(out.glob("leaderboard*")) if path.name == MARKDOWN or PUBLISHED.fullmatch(
        path.name)] if out.is_dir() else []
    # every file it writes, where a folder or a pipe would stop the build half way: refused before any work
    files = sorted({*names, *(out / name for name in (MARKDOWN, CELLS, MANIFEST, IMAGE, PAGE))})
    return [Output(out, "--out", keeps=DERIVED, held=tuple(names), foreign=not_built_here, kind_of=LEADERBOARD_PAGE),
            *(Output(path, "--out", kind=FILE, keeps=DERIVED, within=out) for path in files)]


LEADERBOARD = Command("leaderboard", "leaderboard.md, CSV, PNG and an HTML page from result stores",
                      add_leaderboard_arguments, run_leaderboard, loads_models=False, outputs=_leaderboard_outputs)


VERIFY = Command("verify", "check the fidelity invariants of stores (and that a leaderboard matches them)",
                 add_verify_arguments, run_verify, loads_models=False)

"""The ``bench`` command: each subcommand is a :class:`~bench.arguments.Command` defined beside the code it runs,
assembled here in the order ``bench --help`` lists them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import allocators
from gatesight_learning.calibrate import CALIBRATE
from gatesight_learning.commands import ANALYZE, LABEL, TRAIN
from hybridmodel.commands import MODEL_EVAL, TRAIN_MODEL

from .arguments import Command, add_model_arguments, floats, model_spec, names, options
from .cost import COST
from .publish import LEADERBOARD, VERIFY


def _ratios(text: str) -> list[float]:
    """Kept fractions p: a named grid (default, paper) or comma-separated numbers."""
    from .compare import RATIO_GRIDS

    return list(RATIO_GRIDS[text]) if text in RATIO_GRIDS else floats(text)


def _compression_ratios(text: str) -> list[float]:
    """kvpress's compression ratios 1 − p, checked as typed, -> kept fractions p."""
    from presses.selection import keep_fraction_from

    ratios = []
    for typed, value in zip(names(text), floats(text)):
        try:
            ratios.append(round(keep_fraction_from(None, value), 10))
        except ValueError:
            raise argparse.ArgumentTypeError(f"compression ratio {typed} is outside [0, 1) (the evicted fraction, "
                                             "1 − kept fraction)") from None
    return ratios


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    from .compare import DEFAULT_RATIOS

    p.add_argument("--press", type=names, default=["gatesight"], help="comma list, e.g. gatesight,snapkv,none")
    p.add_argument("--alloc", type=names, default=["flat"],
                   help=f"comma list of allocators: {','.join(allocators.available())}")
    fractions = p.add_mutually_exclusive_group()
    fractions.add_argument("--ratios", type=_ratios, default=list(DEFAULT_RATIOS),
                           help="kept fractions p in (0, 1], or a grid: default (0.02, 0.05, 0.1 … 0.9) or paper "
                                "(0.1 … 0.9)")
    fractions.add_argument("--compression-ratios", type=_compression_ratios, default=None,
                           help="kvpress's naming: fractions evicted, 1 − p in [0, 1) (rows still record p); instead "
                                "of --ratios")
    p.add_argument("--tasks", type=names, default=["ruler"], help="task names or groups (ruler, niah)")
    p.add_argument("--n", type=int, default=2, help="items per task")
    p.add_argument("--length", type=int, default=1024, help="context length in tokens (question included)")
    add_model_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results")
    p.add_argument("--profile", default="compact", help="RULER template profile: compact or faithful")
    p.add_argument("--haystack", default="generated",
                   help="the essay haystack of the tasks that read one (group 'haystack'): generated, or real text "
                        "nothing here trains on: manpages or nodejs-docs (rows and summaries name it)")
    p.add_argument("--scbench-data", default=None, help="local microsoft/SCBench copy (jsonl dir or datasets cache)")
    p.add_argument("--press-options", type=options, default={},
                   help="key=value,... for every press of the run (e.g. window=64 for snapkv; a kvpress:<Class> "
                        "takes its own fields); rows name the press with its options")
    p.add_argument("--alloc-options", type=options, default={},
                   help="key=value,... for every allocator (e.g. weights=1/2/3 for perlayer, safeguard=0.1 for adakv)")
    p.add_argument("--batch", type=int, default=32,
                   help="compacted children of one context answered together (memory: their caches, padded)")
    p.add_argument("--jobs", type=int, default=1,
                   help="worker processes, one context at a time each (each loads the model; one core each)")
    p.add_argument("--engine", default="hf", choices=["hf", "vllm"],
                   help="hf: this project's runtime; vllm: compaction inside vLLM (serving environment; presses "
                        "keydiff, gatesight, triattention; allocator flat)")


def run_compare_command(args) -> None:
    from .compare import CompareSettings, expand_tasks, run_compare, run_rows
    from .files import write_text
    from .report import plot_curves, summary_markdown

    ratios = args.compression_ratios if args.compression_ratios is not None else args.ratios
    settings = CompareSettings(
        presses=args.press, allocators=args.alloc, ratios=ratios, tasks=args.tasks, n=args.n,
        length=args.length, model=model_spec(args), seed=args.seed, out=Path(args.out), profile=args.profile,
        scbench_data=Path(args.scbench_data) if args.scbench_data else None, jobs=args.jobs, batch=args.batch,
        press_options=args.press_options, alloc_options=args.alloc_options, engine=args.engine,
        haystack=args.haystack,
    )
    store = run_compare(settings)
    rows = run_rows(store, settings)
    text = summary_markdown(rows)
    print(text)
    write_text(settings.out / "summary.md", text)
    png = plot_curves(rows, settings.out / "curves.png",
                      f"{', '.join(settings.presses)} · {', '.join(expand_tasks(settings.tasks))} · "
                      f"{settings.length} tokens · n = {settings.n} per task")
    print(f"results: {store.path}\nplot:    {png}")


COMPARE = Command("compare", "score, fork and answer: presses × allocators × kept fractions", add_compare_arguments,
                  run_compare_command)
COMMANDS = (COMPARE, LEADERBOARD, VERIFY, COST, CALIBRATE, TRAIN_MODEL, MODEL_EVAL, LABEL, TRAIN, ANALYZE)


def build_parser() -> argparse.ArgumentParser:
    """One subparser per command of :data:`COMMANDS`, its flags added by the command itself."""
    parser = argparse.ArgumentParser(prog="bench", description="Query-agnostic KV compression for hybrid LLMs")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.help)
        command.add_arguments(p)
        p.set_defaults(command_entry=command)
    return parser


def _quiet_transformers() -> None:
    """No per-weight "Loading weights" bar, and no flash-linear-attention "fast path is not available" warning:
    the runtime drives the GDN layers with its own kernel (runtime/gdn.py) and never calls those fast paths."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    """Run ``bench argv``; exit code 0, 2 with a one-line error on stderr, or 130 when interrupted."""
    args = build_parser().parse_args(argv)
    command: Command = args.command_entry
    if command.loads_models:
        _quiet_transformers()
    try:
        command.run(args)
    except (ValueError, FileNotFoundError) as error:
        print(f"bench {args.command}: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # a full or read-only disk: what was written stays, a rerun resumes
        where = f"{error.filename}: " if error.filename else ""
        print(f"bench {args.command}: error: {where}{error.strerror or error}; what was finished is kept",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        where = f" in {args.out}" if getattr(args, "out", None) else ""
        print(f"\nbench {args.command}: interrupted; what was finished is kept{where} — run the same command again "
              "to resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

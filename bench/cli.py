"""The ``bench`` command: each subcommand is a :class:`~bench.arguments.Command` defined in the bench beside the code
it runs (the library packages below, gatesight_learning and hybridmodel among them, have no flags and never import
the bench), assembled here in the order ``bench --help`` lists them."""

from __future__ import annotations

import argparse
import sys

from .arguments import Command
from .compare_command import COMPARE
from .cost import COST
from .fetch_command import FETCH_MODEL
from .learning_commands import ANALYZE, CALIBRATE, LABEL, TRAIN
from .merge import MERGE
from .model_commands import DISTILL, MODEL_EVAL, TRAIN_MODEL
from .publish import LEADERBOARD, VERIFY

COMMANDS = (COMPARE, MERGE, LEADERBOARD, VERIFY, COST, FETCH_MODEL, CALIBRATE, TRAIN_MODEL, MODEL_EVAL, DISTILL, LABEL,
            TRAIN, ANALYZE)


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

"""``bench cost`` on the command line: its flags (every press the registry builds by its name, by default) and
its ``--out`` (:mod:`bench.run.cost` times them)."""

from __future__ import annotations

import argparse
from pathlib import Path

import presses

from ..run.cost import cost_output, run_cost
from .arguments import (
    Command,
    add_import_argument,
    add_model_arguments,
    import_user_modules,
    ints,
    model_spec,
    names,
)


def add_cost_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_import_argument(parser)
    # every press the registry builds by its name alone (the kvpress bridge needs a class named: kvpress:<Class>)
    by_name = [name for name in presses.available() if name in presses.PRESSES]
    parser.add_argument("--press", type=names, default=by_name)
    parser.add_argument("--lengths", type=ints, default=[1024, 4096, 16384])
    parser.add_argument("--out", default="results/cost")
    parser.add_argument("--replace", action="store_true",
                        help="--out holds a cost table: measure a new one (the old one is moved aside to "
                             "<out>.backup-<time>); refused otherwise")


def run_cost_command(args: argparse.Namespace) -> None:
    import_user_modules(args)
    run_cost(model_spec(args), args.press, args.lengths, Path(args.out), args.replace)


COST = Command("cost", "scoring time per press against prefill time, by context length", add_cost_arguments,
               run_cost_command, outputs=lambda args: [cost_output(Path(args.out), args.replace)])

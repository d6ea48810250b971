"""``bench publish`` on the command line: its flags, and the files of the collection it wrote
(:mod:`bench.store.collection_publish`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from artifacts.output_kinds import COLLECTION
from artifacts.outputs import Output

from ..store.collection_publish import publish
from .arguments import Command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("stores", nargs="+", help="finished result stores (bench compare, bench merge)")
    parser.add_argument("--into", default="docs/results", help="the collection (default docs/results)")


def run(args) -> None:
    written = publish([Path(s) for s in args.stores], Path(args.into),
                      say=lambda line: print(f"publish: {line} …", file=sys.stderr, flush=True))
    for path in written:
        print(f"wrote {path}")
    print(f"{len(written)} file(s) of {args.into} written" if written else
          f"{args.into} holds every row of {', '.join(args.stores)} already: nothing written")


PUBLISH = Command("publish", "add finished stores' rows to a collection (docs/results), one file per group and method",
                  add_arguments, run, loads_models=False,
                  outputs=lambda args: [Output(Path(args.into), "--into", kind_of=COLLECTION)])

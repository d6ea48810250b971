"""What every ``bench`` command is made of: its entry in the CLI (:class:`Command`), and the argument types and
model flags that several commands share. A command's own flags live beside the code it runs."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

from pretrained.loading import ModelSpec


@dataclass(frozen=True)
class Command:
    """One subcommand of ``bench``, as :func:`bench.cli.build_parser` assembles it.

    Attributes
    ----------
    name : str
        What is typed after ``bench``.
    help : str
        The line ``bench --help`` shows for it.
    add_arguments : Callable[[argparse.ArgumentParser], None]
        Adds its flags to its subparser.
    run : Callable[[argparse.Namespace], None]
        Does the work; a :class:`~runtime.errors.UsageError` it raises (or a ``FileNotFoundError`` of a path the
        user named) is shown as ``bench NAME: error: ...``; any other exception as its traceback.
    loads_models : bool
        Whether it loads a model: transformers' progress bars and fast-path warnings are silenced for those only.
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], None]
    loads_models: bool = True


def names(text: str) -> list[str]:
    """``a, b,,c`` -> ``["a", "b", "c"]``."""
    return [x.strip() for x in text.split(",") if x.strip()]


def floats(text: str) -> list[float]:
    """Comma-separated numbers; anything else is an argparse error naming the text."""
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def ints(text: str) -> list[int]:
    """Comma-separated integers; anything else is an argparse error naming the text."""
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def part(text: str) -> tuple[int, int]:
    """``K/N`` -> ``(K, N)`` with ``0 <= K < N``: the share of the work one of N processes takes."""
    index, _, parts = text.partition("/")
    try:
        index, parts = int(index), int(parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected K/N (e.g. 0/2), got {text!r}") from None
    if not 0 <= index < parts:
        raise argparse.ArgumentTypeError(f"part {text}: expected K/N with 0 <= K < N")
    return index, parts


def options(text: str) -> dict:
    """``key=value,...`` -> ``{key: value}``, the values left as text."""
    parsed = {}
    for pair in names(text):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"expected key=value pairs separated by commas, got {pair!r}")
        parsed[key.strip()] = value.strip()  # text: each press or allocator types it by its field
    return parsed


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model``, ``--device``, ``--dtype`` and ``--allow-download``: which model a command loads, and how."""
    parser.add_argument("--model", default=None, help="a pretrained model's name (smollm2-135m-instruct; `bench "
                                                      "fetch-model` gets it once), a local model directory, or a hub "
                                                      "id in the local Hugging Face cache (default: the shipped "
                                                      "hybrid)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--dtype", default="float32", help="auto (the checkpoint's), float32, bfloat16 or float16")
    parser.add_argument("--allow-download", action="store_true",
                        help="fetch a hub id missing from the local cache (runs are offline otherwise)")


def model_spec(args: argparse.Namespace) -> ModelSpec:
    """The model the flags of :func:`add_model_arguments` name (checked as it is built)."""
    return ModelSpec(args.model, args.device, args.dtype, args.allow_download)

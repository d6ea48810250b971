"""What every ``bench`` command is made of: its entry in the CLI (:class:`Command`), and the argument types and
model flags that several commands share. A command's own flags live in its own module of the commands
(``*_command.py``), beside what it prints."""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from artifacts.outputs import Output
from pretrained import CHECKPOINTS, loading
from pretrained.loading import ModelSpec
from pretrained.model_info import ModelInfo, read
from pretrained.model_spec import is_hub_id
from runtime.errors import UsageError
from runtime.options import EscapedText, real, whole, written_plainly
from runtime.user_code import raised_at
from runtime.user_imports import import_guarded


@dataclass(frozen=True)
class Command:
    """One subcommand of ``bench``, as :func:`bench.commands.cli.build_parser` assembles it.

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
    outputs : Callable[[argparse.Namespace], list[Output]]
        Where it writes (:mod:`artifacts.outputs`), checked by :func:`bench.commands.cli.main` before ``run`` starts.
    interrupted : Callable[[argparse.Namespace], str]
        What Ctrl-C leaves, as :func:`bench.commands.cli.main` says it: what is kept and whether a rerun resumes.
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], None]
    loads_models: bool = True
    outputs: Callable[[argparse.Namespace], list[Output]] = lambda args: []
    interrupted: Callable[[argparse.Namespace], str] = lambda args: (
        "each file it writes is written whole, so none is left half-written; it does not resume: run it again to "
        "start over")


def kept_in(folder: str | Path, what: str, rerun: str) -> str:
    """What Ctrl-C leaves in ``folder``, a folder a command fills as it goes: ``what`` kept there and how a
    ``rerun`` goes on, or that nothing was written where it holds no file yet (a run stopped before its first)."""
    folder = Path(folder)
    if not folder.is_dir() or not any(not p.name.startswith(".") for p in folder.iterdir()):
        return (f"nothing was written yet ({folder} {'holds no file' if folder.is_dir() else 'was not created'}); "
                "run the same command again to start")
    return f"{what} kept in {folder} — {rerun}"


def names(text: str) -> list[str]:
    """``a, b,,c`` -> ``["a", "b", "c"]``."""
    return [x.strip() for x in text.split(",") if x.strip()]


def _plain(text: str) -> str:
    """``text``, where its numbers are written plainly (:func:`runtime.options.written_plainly`); anything else an
    argparse error naming the text."""
    if not written_plainly(text):
        raise argparse.ArgumentTypeError(f"expected a number in ASCII digits (no '_'), got {text!r}")
    return text


def _typed(parse: Callable, text: str):
    """``parse(text)``, its :class:`~runtime.errors.UsageError` an argparse error (one line naming the flag)."""
    try:
        return parse(_plain(text))
    except UsageError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def count(text: str) -> int:
    """An integer >= 1 (items, steps, threads, tokens)."""
    return _typed(lambda value: whole(value, "", 1), text)


def natural(text: str) -> int:
    """An integer >= 0 (a seed, steps that may be none)."""
    return _typed(lambda value: whole(value, "", 0), text)


def positive(text: str) -> float:
    """A finite number > 0 (a learning rate, a threshold)."""
    return _typed(lambda value: real(value, "", 0.0, above=True), text)


def nonnegative(text: str) -> float:
    """A finite number >= 0 (hours)."""
    return _typed(lambda value: real(value, "", 0.0), text)


def share(text: str) -> float:
    """A finite number in [0, 1] (a fraction of the training rows)."""
    return _typed(lambda value: real(value, "", 0.0, 1.0), text)


def floats(text: str) -> list[float]:
    """Comma-separated numbers; anything else is an argparse error naming the text."""
    try:
        return [float(x) for x in _plain(text).split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def ints(text: str) -> list[int]:
    """Comma-separated integers, each once (a length given twice would be measured and reported twice); anything
    else is an argparse error naming the text."""
    try:
        values = [int(x) for x in _plain(text).split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        raise argparse.ArgumentTypeError(f"{', '.join(map(str, twice))} given more than once in {text!r}; "
                                         "give each value once")
    return values


def part(text: str) -> tuple[int, int]:
    """``K/N`` -> ``(K, N)`` with ``0 <= K < N``: the share of the work one of N processes takes."""
    index, _, parts = _plain(text).partition("/")
    try:
        index, parts = int(index), int(parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected K/N (e.g. 0/2), got {text!r}") from None
    if not 0 <= index < parts:
        raise argparse.ArgumentTypeError(f"part {text}: expected K/N with 0 <= K < N")
    return index, parts


def options(text: str) -> dict:
    """``key=value,...`` -> ``{key: value}``, the values left as text, with its escapes (``%2C`` for a comma: a text
    option decodes them, :class:`runtime.options.EscapedText`)."""
    parsed = {}
    for pair in names(text):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"expected key=value pairs separated by commas, got {pair!r}")
        if key.strip() in parsed:
            raise argparse.ArgumentTypeError(f"option {key.strip()!r} is given twice in {text!r}; give it once")
        parsed[key.strip()] = EscapedText(value.strip())  # text: each press or allocator types it by its field
    return parsed


def label_folder(text: str) -> str:
    """``--labels``: the folder of label shards ``bench label --out`` wrote; a file there is refused as the flag is
    read, before anything checks what the command would write."""
    if Path(text).is_file():
        raise argparse.ArgumentTypeError(f"{text} is a file: give the folder of label shards that `bench label --out` "
                                         f"wrote (here perhaps {Path(text).parent})")
    return text


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


def did_you_mean(name: str, known) -> str:
    """`` (did you mean X?)`` for the names of ``known`` close to ``name`` (difflib), or nothing."""
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def check_model_name(name: str | None) -> None:
    """A :class:`~runtime.errors.UsageError` listing the catalogue (the names close to ``name`` first) if ``name``
    is none of what ``--model`` takes: a catalogued name, a path that exists, or a hub id (``owner/name``)."""
    names = [loading.DEFAULT_MODEL_NAME, *CHECKPOINTS]
    if name is None or name in names or Path(name).expanduser().exists() or is_hub_id(name):
        return
    raise UsageError(f"no model at --model {name!r}: no such directory, and no catalogued model of that name"
                     f"{did_you_mean(name, names)}; catalogued: {', '.join(names)} (the first is the default; or "
                     "give a model directory, or a hub id such as Qwen/Qwen3.5-0.8B)")


def model_spec(args: argparse.Namespace) -> ModelSpec:
    """The model the flags of :func:`add_model_arguments` name, checked as :func:`model_info` checks it."""
    return model_info(args).spec


def model_info(args: argparse.Namespace) -> ModelInfo:
    """The model the flags of :func:`add_model_arguments` name, read once (:func:`pretrained.model_info.read`) and
    checked: its name (near misses of the catalogue named), device and dtype, and that its directory holds weights,
    a tokenizer's vocabulary and JSON files transformers can read."""
    check_model_name(args.model)
    info = read(ModelSpec(args.model, args.device, args.dtype, args.allow_download))
    directory = info.directory
    loading.check_not_adapter(directory)
    if not any(path.suffix != ".json" for path in loading.part_files(directory, "weights", info.config)):
        patterns = " or ".join(loading.MODEL_PARTS["weights"])
        raise UsageError(f"--model {directory}: no weight file ({patterns}, or the shards a weight index names) "
                         "beside its config.json; the bench loads a model from its weights: copy them there, or give "
                         "the model's own directory")
    loading.check_tokenizer_files(directory)
    info.check_json_files()
    return info


def add_import_argument(p: argparse.ArgumentParser) -> None:
    """``--import MODULE`` (repeatable): a module of the user's that registers presses or allocators when imported."""
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (repeatable): a module of your own that registers presses or "
                        "allocators (@presses.register), found from the current directory or installed; an "
                        "installed package's entry points (hybridpress.presses) need no flag")


def import_user_modules(args: argparse.Namespace) -> None:
    """Import each ``--import`` module, the current directory searched first as ``python -m`` does; one that cannot
    be imported, raises or exits while it is imported is a :class:`~runtime.errors.UsageError` naming it and why,
    with the file and line where it raised (``--debug`` shows its traceback): the error is in the user's code, not
    the bench's."""
    if args.imports and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for module in args.imports:
        if "/" in module or "\\" in module or module.endswith(".py"):
            name = Path(module).name.removesuffix(".py")
            raise UsageError(f"--import {module}: give a module's name, not a path (e.g. --import {name} for "
                             f"{name}.py, run from its folder or with that folder on PYTHONPATH)")
        try:
            import_guarded(lambda: importlib.import_module(module), f"--import {module}")
        except ImportError as error:
            if not _not_found(error, module):  # the module was found: an import inside it failed
                raise UsageError(f"--import {module}: importing it raised {type(error).__name__}: "
                                 f"{' '.join(str(error).split())} ({raised_at(error)})") from error
            raise UsageError(f"--import {module}: {error} (give a module importable from the current directory, "
                             "e.g. my_press for ./my_press.py, or from an installed package)") from None
        except UsageError:
            raise
        except Exception as error:  # noqa: BLE001 - whatever the user's module raises is theirs to fix: one line
            raise UsageError(f"--import {module}: importing it raised {type(error).__name__}: "
                             f"{' '.join(str(error).split())} ({raised_at(error)})") from error


def _not_found(error: ImportError, module: str) -> bool:
    """Whether ``error`` says ``module`` itself (or a package on its dotted path) is not found, not that an import
    its own code made failed."""
    return isinstance(error, ModuleNotFoundError) and error.name is not None and (
        module == error.name or module.startswith(f"{error.name}."))


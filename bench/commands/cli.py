"""The ``bench`` command: each subcommand is a :class:`~bench.commands.arguments.Command` defined in its own module of
the commands (the rooms below, and the library packages, gatesight_learning and hybridmodel among them, have no flags
and never import the commands), assembled here in the order ``bench --help`` lists them."""

from __future__ import annotations

import argparse
import errno
import io
import os
import re
import sys
import traceback
from contextlib import contextmanager, suppress
from pathlib import Path

from artifacts.files import INSTALLED
from artifacts.outputs import check as check_outputs
from pretrained.cache_guard import check_outside_the_cache
from runtime.errors import UsageError
from runtime.fused_kernels import kernel_choice
from runtime.user_code import UserCodeError

from ..run.label_settings import setting_problem
from ..run.stopping import StopOnSignals, WorkerDied, stopped
from ..store.label_read_back import check_settings_with
from .arguments import Command
from .carry_command import CARRY
from .compare_command import COMPARE
from .cost_command import COST
from .distill_commands import DISTILL, SHIP_ARTIFACTS
from .fetch_command import FETCH_MODEL
from .leaderboard_command import LEADERBOARD, VERIFY
from .learning_commands import ANALYZE, CALIBRATE, CALIBRATE_SHARES, LABEL, TRAIN
from .merge_command import MERGE
from .model_commands import MODEL_EVAL, TRAIN_MODEL
from .publish_command import PUBLISH

check_settings_with(setting_problem)  # every reader of a store rebuilds a registered label's setting (probe 18, #3)

COMMANDS = (COMPARE, MERGE, PUBLISH, LEADERBOARD, VERIFY, CARRY, COST, FETCH_MODEL, CALIBRATE, CALIBRATE_SHARES,
            TRAIN_MODEL, MODEL_EVAL, DISTILL, SHIP_ARTIFACTS, LABEL, TRAIN, ANALYZE)


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser, its errors one line as every other error of the bench (``bench CMD: error: ...``), without
    the usage block: ``bench CMD --help`` lists the flags."""

    commands: dict[str, argparse.ArgumentParser] = {}
    """The command's parsers by name (the top-level parser's): a flag no command takes is named by the command."""

    def error(self, message: str):
        missing = re.fullmatch(r"argument ([^:/\s]+)\S*: expected one argument", message)
        if missing:  # argparse takes a value such as -1/3 or -inf for a flag
            message += f" (a value that starts with '-' is given as {missing[1]}=VALUE)"
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the flags)\n")

    def parse_args(self, args=None, namespace=None):
        parsed, extra = self.parse_known_args(args, namespace)
        command = self.commands.get(getattr(parsed, "command", None), self)
        if extra:  # argparse names the top-level parser, whose --help lists no command's flags
            command.error(f"unrecognized arguments: {' '.join(extra)}")
        given = sys.argv[1:] if args is None else list(map(str, args))
        twice = repeated_flag(command, given)
        if twice is not None:
            command.error(f"{twice} is given twice: give it once (only the last would count)")
        empty = empty_value(command, given, parsed)
        if empty is not None:
            command.error(f"{empty} is empty: give a value (a name or a path; '' would mean the current folder)")
        return parsed


def empty_value(parser: argparse.ArgumentParser, argv: list[str], parsed: argparse.Namespace) -> str | None:
    """The first flag of ``parser`` that ``argv`` gives an empty value (``--out ''``, ``--out=``), or positional
    argument parsed as one; None if there is none. A path, a name or options are never empty (a path read from '' is
    the current folder). A list typed as '' is left to its command, which names what the list should hold."""
    options = parser._option_string_actions
    for at, token in enumerate(argv):
        if token == "--":
            break
        name, given, value = token.partition("=")
        action = options.get(name)
        if action is None or action.nargs == 0 or not name.startswith("-") or _a_list(action):
            continue
        if (given and not value) or (not given and at + 1 < len(argv) and argv[at + 1] == ""):
            return max(action.option_strings, key=len)
    for action in parser._actions:
        value = getattr(parsed, action.dest, None) if not action.option_strings else None
        if value == "" or (isinstance(value, list) and "" in value):
            return action.dest
    return None


def _a_list(action: argparse.Action) -> bool:
    """Whether the flag's type reads '' as an empty list (``--press``, ``--lengths``)."""
    try:
        return callable(action.type) and action.type("") == []
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return False


def repeated_flag(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The first flag of ``parser`` that ``argv`` gives twice, by its name, a prefix argparse accepts for it, or
    ``--flag=value``; None if none is. A flag that gathers its values (``--import``, ``--artifacts``: repeatable, an
    ``append`` action) is not one (probe 22, #1)."""
    options = parser._option_string_actions
    seen = set()
    for token in argv:
        if token == "--":  # what follows is positional
            break
        if not token.startswith("--"):
            continue
        name = token.split("=", 1)[0]
        actions = [options[name]] if name in options else list({id(action): action for option, action in
                                                                  options.items() if option.startswith(name)}.values())
        if len(actions) != 1 or isinstance(actions[0], (argparse._AppendAction, argparse._ExtendAction)):
            continue  # argparse has refused it already, it is a value, or each one counts
        if actions[0].dest in seen:
            return max(actions[0].option_strings, key=len)
        seen.add(actions[0].dest)
    return None


def build_parser() -> argparse.ArgumentParser:
    """One subparser per command of :data:`COMMANDS`, its flags added by the command itself."""
    parser = OneLineParser(prog="bench", description="Query-agnostic KV compression for hybrid LLMs")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.help)
        command.add_arguments(p)
        p.add_argument("--debug", action="store_true",
                       help="show the traceback of a usage error too (every other error shows its own)")
        p.set_defaults(command_entry=command)
    parser.commands = dict(sub.choices)
    return parser


def _quiet_transformers() -> None:
    """No per-weight "Loading weights" bar, and no flash-linear-attention "fast path is not available" warning:
    the runtime drives the GDN layers with its own kernel (runtime/gdn.py) and never calls those fast paths."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES)
"""A full disk, a quota, a read-only or unwritable place: the user's to fix, shown in one line."""


def _user_named(error: OSError, args) -> bool:
    """A file error the user can fix: one our code (or a library) raised with a message (no ``filename``), or one of
    a path the command line named (or one inside it, e.g. a file of the ``--model`` directory)."""
    if error.filename is None:
        return error.errno is None or isinstance(error, FileNotFoundError)
    failed = Path(error.filename)
    for value in vars(args).values():
        for named in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(named, (str, Path)) and str(named) and (
                    failed == Path(named) or Path(named) in failed.parents):
                return True
    return False


def _wrapped_interrupt(error: BaseException) -> KeyboardInterrupt | None:
    """The interrupt a library turned into another error (a C extension's import stopped by SIGTERM: pybind11 raises
    ``ImportError: initialization failed`` from it), or None: it is a stop, not a bug."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def _kept(command: Command, args) -> str:
    """What a stopped command leaves: what it had put in place whole (:data:`artifacts.files.INSTALLED`), or else
    what its own rule says."""
    done = "; ".join(INSTALLED)
    return f"{done} (put in place whole before it stopped)" if done else command.interrupted(args)


class OutputStreamError(OSError):
    """A write to standard output or standard error that failed (its reader closed early, as ``| head`` does; a
    full disk behind it), told apart from a failed write of a file the command makes. ``stream``: ``"stdout"`` or
    ``"stderr"``."""

    def __init__(self, stream: str, error: OSError):
        super().__init__(error.errno, error.strerror)
        self.stream = stream


class _MarkedStream:
    """``sys.stdout`` or ``sys.stderr`` (``name``), its failed writes raised as :class:`OutputStreamError`."""

    def __init__(self, stream, name: str):
        self._stream, self._name = stream, name

    def __getattr__(self, attribute):
        return getattr(self._stream, attribute)

    def write(self, text: str) -> int:
        return self._marked(self._stream.write, text)

    def flush(self) -> None:
        self._marked(self._stream.flush)

    def _marked(self, call, *args):
        try:
            return call(*args)
        except OSError as error:
            raise OutputStreamError(self._name, error) from None


@contextmanager
def _marked_output():
    """Standard output and error marked (:class:`_MarkedStream`) inside, and flushed at the end of the block (where a
    failure is told as one line, not at exit); after a failure that stream goes to the null device, so that exiting
    does not fail on it once more. A stream that is not there (``>&-``: None) is left as it is."""
    streams = {name: getattr(sys, name) for name in ("stdout", "stderr")}
    for name, stream in streams.items():
        if stream is not None:
            setattr(sys, name, _MarkedStream(stream, name))
    try:
        yield
        for name, stream in streams.items():
            if stream is not None:
                getattr(sys, name).flush()
    except OutputStreamError as error:
        with suppress(OSError, ValueError, io.UnsupportedOperation):  # a stream with no descriptor (a test's)
            os.dup2(os.open(os.devnull, os.O_WRONLY), streams[error.stream].fileno())
        raise
    finally:
        for name, stream in streams.items():
            setattr(sys, name, stream)


def _say(line: str) -> None:
    """``line`` on standard error, where it is still there to take it (full, or closed with standard output: then
    the exit code alone tells)."""
    with suppress(OSError, ValueError):
        print(line, file=sys.stderr)


def _usage_error(error: BaseException, args) -> str | None:
    """The one line that says what the user can fix, or None: an error that is a bug shows its traceback."""
    if isinstance(error, UsageError):
        return str(error)
    if isinstance(error, OSError) and error.errno in DISK_ERRORS:  # what was written stays, a rerun resumes
        place = error.filename or getattr(args, "out", None)  # a write to an open file names none: its --out
        where = f"{place}: " if place else ""
        return f"{where}{error.strerror or error}; what was finished is kept"
    if isinstance(error, OSError) and _user_named(error, args):
        return " ".join(str(error).split())  # a library's message may span lines; the bench's error is one
    return None


def main(argv: list[str] | None = None) -> int:
    """Run ``bench argv``; exit code 0, 2 with a one-line error on stderr for what the user can fix (a flag argparse
    refuses; :class:`~runtime.errors.UsageError`, among them every place the command writes that the output policy
    refuses, :mod:`artifacts.outputs`, checked before the command starts; a file error of a path they named; a full
    or read-only disk; a worker process killed from outside, :class:`bench.run.stopping.WorkerDied`; a failed write to
    standard output, :class:`OutputStreamError` (to standard error: no line); ``--debug``: with its traceback), 141
    quietly when the reader of its output closed early (``| head``), or 130 when interrupted (143 on SIGTERM, 129 on
    SIGHUP, raised as interrupts: :mod:`bench.run.stopping`). Any other exception is a bug and propagates with its
    traceback."""
    with StopOnSignals():
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as done:  # --help (0), or a flag argparse refused (2, its one line printed)
            return done.code
        except KeyboardInterrupt as stop:
            return stopped(stop, "bench", "it stopped while starting, before any work: nothing was written")
        command: Command = args.command_entry
        INSTALLED.clear()
        try:
            if command.loads_models:
                _quiet_transformers()
                kernel_choice()  # a mistyped HYBRIDPRESS_KERNELS is one line now, not an error in the first prefill
            outputs = command.outputs(args)
            check_outside_the_cache(outputs)
            check_outputs(outputs)
            with _marked_output():
                command.run(args)
        except KeyboardInterrupt as stop:
            return stopped(stop, f"bench {args.command}", _kept(command, args))
        except Exception as error:
            stop = _wrapped_interrupt(error)
            if stop is not None:
                return stopped(stop, f"bench {args.command}", _kept(command, args))
            if isinstance(error, OutputStreamError):
                if error.errno == errno.EPIPE:  # its reader closed early (`| head`): as any command, quietly
                    return 141
                if error.stream == "stdout":
                    _say(f"bench {args.command}: error: standard output: {error.strerror}; what it printed there is "
                         "cut short")
                return 2
            if isinstance(error, WorkerDied):
                _say(f"bench {args.command}: error: {error}; {command.interrupted(args)}")
                return 2
            message = _usage_error(error, args)
            if message is None:
                raise
            user_code = isinstance(error, UserCodeError)
            if args.debug and user_code and error.details:  # the user's traceback: a worker's error comes without it
                _say(error.details.rstrip())
            elif args.debug:
                traceback.print_exc()
            if user_code:  # it failed part-way through the work, as a stop does
                message = f"{message}; {_kept(command, args)}"
            _say(f"bench {args.command}: error: {message}")
            return 2
    return 0

if __name__ == "__main__":
    sys.exit(main())

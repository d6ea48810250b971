"""The one error type for what the user can fix: a bad flag or value, a file they named that is missing, settings
that do not match a store. ``bench`` shows it as one line (exit 2); every other exception is a bug and shows its
traceback. A ``ValueError``, so that callers that catch or expect one keep working; an argument of the wrong kind is
its :class:`ArgumentTypeError`, a ``TypeError`` too."""

import os
from pathlib import Path


class UsageError(ValueError):
    """Something the user can fix, said in one line: what is wrong and what is allowed."""


class ArgumentTypeError(UsageError, TypeError):
    """An argument of a kind the call does not take (text where token ids belong, a class where an instance does):
    a ``TypeError`` as Python's own are, and a :class:`UsageError`, so that ``bench`` shows it as one line."""


class MissingFileError(UsageError, FileNotFoundError):
    """A file or directory the user named that is not there (a model, a store): a :class:`UsageError`, shown as one
    line, and a ``FileNotFoundError`` for callers that catch that."""


class ReleasedError(UsageError, RuntimeError):
    """A parent or child cache used after its ``release()``: a :class:`UsageError`, shown as one line, and a
    ``RuntimeError`` for callers that catch that."""


def describe(value) -> str:
    """A wrong argument as an error message names it: its type and (shortened) value, or for a class that it is one."""
    if isinstance(value, type):
        return f"the class {value.__name__}"
    return f"{type(value).__name__} {value!r}"[:120]


def check_regular_file(path, what: str, remedy: str = "move it away and put the file there") -> None:
    """:class:`UsageError` naming ``path`` (``what``: the file, as the message names it; ``remedy``: what the user
    does about it) where it is there but is no regular file: a pipe, whose reader waits for a writer forever (inside a
    native reader, past SIGTERM), a socket, a device or a folder, which libraries name by their error number alone."""
    path = Path(path)
    if path.exists() and not path.is_file():
        kind = "a folder" if path.is_dir() else "not a regular file"
        raise UsageError(f"{path}: {kind}, where {what} belongs; {remedy}")


def link_target(path) -> str | None:
    """Where the symbolic link ``path`` leads, as the link says it (``os.readlink``), or None where ``path`` is no
    link: a message names it, since a link to ``/dev/null`` or to nothing is not what its name suggests."""
    return os.readlink(path) if Path(path).is_symlink() else None


def not_a_directory(path) -> str:
    """What ``path``, where a directory was given, is instead, as a message says it: a file or nothing, or a link,
    named with where it leads (``a link to /dev/null, not a directory``)."""
    path, target = Path(path), link_target(path)
    if target is None:
        return "a file, not a directory" if path.exists() else "no such directory"
    return f"a link to {target}, not a directory" if path.exists() else f"a link to {target}, which does not exist"


def missing_file(path) -> str:
    """A file that is not there, as a message says it: ``no NAME``, or for a link that leads nowhere ``NAME is a
    link to TARGET, which does not exist``."""
    path, target = Path(path), link_target(path)
    return f"no {path.name}" if target is None else f"{path.name} is a link to {target}, which does not exist"

"""The one error type for what the user can fix: a bad flag or value, a file they named that is missing, settings
that do not match a store. ``bench`` shows it as one line (exit 2); every other exception is a bug and shows its
traceback. A ``ValueError``, so that callers that catch or expect one keep working; an argument of the wrong kind is
its :class:`ArgumentTypeError`, a ``TypeError`` too."""

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

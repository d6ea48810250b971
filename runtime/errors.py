"""The one error type for what the user can fix: a bad flag or value, a file they named that is missing, settings
that do not match a store. ``bench`` shows it as one line (exit 2); every other exception is a bug and shows its
traceback. A ``ValueError``, so that callers that catch or expect one keep working; an argument of the wrong kind is
its :class:`ArgumentTypeError`, a ``TypeError`` too."""


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

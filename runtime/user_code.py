"""A user's own press or allocator failing while the bench runs it: one line naming it, the error and where in the
user's code it was raised, as a user's module that fails while it is imported is said (:mod:`runtime.user_imports`).

The line is a :class:`UserCodeError`, a :class:`~runtime.errors.UsageError`: the error is in code the user wrote and
can fix, not in the bench, whose own failures stay bugs with their tracebacks. Which code is whose is told by where a
class comes from: one of :data:`PROJECT_PACKAGES`, or not (a ``--import``ed module, an installed package, a script).
"""

from __future__ import annotations

import sysconfig
import traceback
from pathlib import Path
from typing import Callable, TypeVar

from .errors import UsageError

T = TypeVar("T")
PROJECT_PACKAGES = ("runtime", "presses", "allocators", "workloads", "artifacts", "pretrained", "bench",
                    "gatesight_learning", "hybridmodel", "serving", "testing")
"""The project's own top-level packages (``pyproject.toml``'s ``packages.find``): a class of theirs is the bench's."""
_PROJECT_ROOT = Path(__file__).resolve().parents[1]
_LIBRARY_PATHS = tuple({sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")})


class UserCodeError(UsageError):
    """A user's press or allocator that raised (or called ``sys.exit``) while the bench ran it: one line, to which
    ``bench`` adds what the command kept. ``details``: the user's traceback as text, which ``--debug`` shows; text,
    since a worker process sends the error to the driver pickled, which drops a traceback."""

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.details = details


def is_users(cls: type) -> bool:
    """Whether ``cls`` is a user's class, defined outside the project's packages (a class made with ``type()`` over an
    ABC names ``abc`` as its module: not the project's either)."""
    return str(getattr(cls, "__module__", "")).partition(".")[0] not in PROJECT_PACKAGES


def _theirs(filename: str) -> bool:
    """Whether a frame of ``filename`` is the user's code: not the project's, Python's or an installed library's."""
    if filename.startswith("<"):  # Python's frozen import machinery, code made by exec
        return False
    path = Path(filename).resolve()
    inside = [_PROJECT_ROOT / package for package in PROJECT_PACKAGES] + [Path(p) for p in _LIBRARY_PATHS if p]
    return not any(path.is_relative_to(folder) for folder in inside)


def raised_at(error: BaseException) -> str:
    """``file:line`` where ``error`` was raised: a syntax error's own place, else the innermost frame of the user's
    code (:func:`_theirs`: the line they would edit, not the library call it failed in), else the innermost frame."""
    if isinstance(error, SyntaxError) and error.filename:
        return f"{error.filename}:{error.lineno}"
    frames = traceback.extract_tb(error.__traceback__)
    frame = next((f for f in reversed(frames) if _theirs(f.filename)), frames[-1])
    return f"{frame.filename}:{frame.lineno}"


def run_users(call: Callable[..., T], owner: type, shown: str, doing: str, /, *arguments, **keywords) -> T:
    """``call(*arguments, **keywords)``: ``owner`` (a press's or allocator's class) or one of its methods, ``shown`` as
    messages name that owner, ``doing`` what the call is (``"in score"``, ``"as it was built"``); positional only, so
    that a class's own fields named ``call`` or ``shown`` pass through ``keywords``.

    Raises
    ------
    UserCodeError
        Where it calls ``sys.exit`` (which ended a run silently with its status and no rows, probe 11), whoever's it
        is; where it raises an ``Exception`` that is no :class:`~runtime.errors.UsageError` and ``owner`` is a user's
        class (:func:`is_users`), naming the error and where it was raised, chained to it. The project's own classes'
        errors go on up unchanged: they are the bench's bugs, with their tracebacks.
    """
    try:
        return call(*arguments, **keywords)
    except SystemExit as called:
        raise UserCodeError(f"{shown} called sys.exit({called.code!r}) {doing}; a press or allocator the bench runs "
                            "returns its result and never ends the process") from None
    except UsageError:
        raise
    except Exception as raised:
        if not is_users(owner):
            raise
        said = " ".join(str(raised).split())
        raise UserCodeError(f"{shown} raised {type(raised).__name__} {doing}{': ' + said if said else ''} "
                            f"({raised_at(raised)})", "".join(traceback.format_exception(raised))) from raised

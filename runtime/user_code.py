"""A user's own press or allocator failing while the bench runs it: one line naming it, the error and where in the
user's code it was raised, as a user's module that fails while it is imported is said (:mod:`runtime.user_imports`).

The line is a :class:`UserCodeError`, a :class:`~runtime.errors.UsageError`: the error is in code the user wrote and
can fix, not in the bench, whose own failures stay bugs with their tracebacks. Which code is whose is told by where a
class comes from: one of :data:`PROJECT_PACKAGES`, or not (a ``--import``ed module, an installed package, a script).
"""

from __future__ import annotations

import contextlib
import os
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


class ProcessExit(BaseException):
    """``os._exit`` called by a user's code while the bench runs it (:func:`process_exit_refused`), raised in its
    place; a :class:`BaseException`, so that the user's own ``except Exception`` does not swallow it."""

    def __init__(self, status):
        super().__init__(status)
        self.status = status


def _exit_refused(status):
    raise ProcessExit(status)


@contextlib.contextmanager
def process_exit_refused():
    """``os._exit`` raising :class:`ProcessExit` within, put back after: it ends the process where it stands, without
    the bench's line, its ``.lock`` removed or its exit status (probe 12: a press's ``os._exit(0)`` ended a run with
    status 0, no rows and no word). Code that bound ``os._exit`` to a name of its own before is not reached."""
    real_exit = os._exit
    os._exit = _exit_refused
    try:
        yield
    finally:
        os._exit = real_exit


def run_users(call: Callable[..., T], owner: type, shown: str, doing: str, /, *arguments,
              passing: tuple[type[Exception], ...] = ()) -> T:
    """``call(*arguments)``: ``owner`` (a press's or allocator's class) or one of its methods, ``shown`` as messages
    name that owner, ``doing`` what the call is (``"in score"``, ``"as it was built"``). Every call of a user's press
    or allocator goes through here (built with its options, ``bind``, ``check``, ``evidence``, ``score``,
    ``allocate`` …), so that none can end the run in a traceback or without a word.

    Parameters
    ----------
    passing : tuple of exception types
        What the method raises by its contract (``check``'s ``ValueError``: the press cannot run on this model),
        passed on unchanged for the caller to say.

    Raises
    ------
    UserCodeError
        Where it calls ``sys.exit`` or ``os._exit`` (which ended a run silently with its status and no rows, probes
        11 and 12), whoever's it is; where it raises anything else but ``KeyboardInterrupt`` (the user's Ctrl-C,
        which stops the run as anywhere), a :class:`~runtime.errors.UsageError` or an exception of ``passing``, and
        ``owner`` is a user's class (:func:`is_users`), naming the error and where it was raised, chained to it: a
        :class:`BaseException` of its own or ``GeneratorExit`` included. The project's own classes' errors go on up
        unchanged: they are the bench's bugs, with their tracebacks.
    """
    try:
        with process_exit_refused():
            return call(*arguments)
    except (SystemExit, ProcessExit) as called:
        how = f"sys.exit({called.code!r})" if isinstance(called, SystemExit) else f"os._exit({called.status!r})"
        raise UserCodeError(f"{shown} called {how} {doing}; a press or allocator the bench runs returns its result "
                            "and never ends the process") from None
    except (UsageError, KeyboardInterrupt, *passing):
        raise
    except BaseException as raised:
        if not is_users(owner):
            raise
        said = " ".join(str(raised).split())
        raise UserCodeError(f"{shown} raised {type(raised).__name__} {doing}{': ' + said if said else ''} "
                            f"({raised_at(raised)})", "".join(traceback.format_exception(raised))) from raised

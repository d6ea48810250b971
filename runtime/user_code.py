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

from . import model_guard
from .errors import UsageError
from .process_guard import HeldProcess, ProcessExit

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


SHOULD = "a press or allocator the bench runs returns its result"
"""What a press or allocator does, as refusals of what one did instead say it."""


def run_users(call: Callable[..., T], owner: type, shown: str, doing: str, /, *arguments,
              passing: tuple[type[Exception], ...] = (), model=None) -> T:
    """``call(*arguments)``: ``owner`` (a press's or allocator's class) or one of its methods, ``shown`` as messages
    name that owner, ``doing`` what the call is (``"in score"``, ``"as it was built"``). Every call of a press or
    allocator goes through here (built with its options, ``bind``, ``check``, ``evidence``, ``score``, ``allocate``
    …), the project's own included, so that none can end the run in a traceback or without a word, nor leave the
    process (:class:`~runtime.process_guard.HeldProcess`), the model or the functions it runs through
    (:mod:`runtime.model_guard`) other than it found them.

    Parameters
    ----------
    passing : tuple of exception types
        What the method raises by its contract (``check``'s ``ValueError``: the press cannot run on this model),
        passed on unchanged for the caller to say.
    model : torch.nn.Module, optional
        The model the call reads (a press's ``score``: its context's), whose modules it is held to leave as they
        were; torch's functions and global hooks are held whether or not it is given.

    Raises
    ------
    UserCodeError
        Where it calls ``sys.exit``, ``os._exit``, an ``os.exec*`` or ``os.abort`` (which ended a run silently with
        its status and no rows, probes 11 to 13), whoever's it is; where it returns having changed the process, the
        model or torch's functions (put back first where the process's); where it raises anything else but
        ``KeyboardInterrupt`` (the user's Ctrl-C, which stops the run as anywhere), a
        :class:`~runtime.errors.UsageError` or an exception of ``passing``, and ``owner`` is a user's class
        (:func:`is_users`), naming the error and where it was raised, chained to it: a :class:`BaseException` of its
        own or ``GeneratorExit`` included. The project's own classes' errors go on up unchanged: they are the bench's
        bugs, with their tracebacks.
    """
    held, before = HeldProcess(shown), model_guard.state(model)
    try:
        with held:
            result = call(*arguments)
    except (SystemExit, ProcessExit) as called:
        how = f"sys.exit({called.code!r})" if isinstance(called, SystemExit) else called.how
        raise UserCodeError(f"{shown} called {how} {doing}; {SHOULD} and never ends the process") from None
    except (UsageError, KeyboardInterrupt, *passing):
        raise
    except BaseException as raised:
        if not is_users(owner):
            raise
        said = " ".join(str(raised).split())
        raise UserCodeError(f"{shown} raised {type(raised).__name__} {doing}{': ' + said if said else ''} "
                            f"({raised_at(raised)})", "".join(traceback.format_exception(raised))) from raised
    change = held.changes()
    if change is None and (found := model_guard.changed(before, model_guard.state(model))):
        change = f"changed {found[0]}", found[1]
    if change is not None:
        raise UserCodeError(f"{shown} {change[0]} {doing} ({change[1]}); {SHOULD} and leaves the process, the model "
                            "and torch's functions as it found them")
    return result

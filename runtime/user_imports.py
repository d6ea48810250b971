"""Importing a user's code (``--import MODULE``, an installed package's entry point) so that what it does to the
process while it is imported is one line naming it.

A module that registers a press runs in the bench's own process. Exiting there (``sys.exit``, ``os._exit``),
closing or replacing the standard streams or their descriptors, replacing a module already imported, moving the
working directory, changing the file mode mask, lowering the recursion limit or leaving threads that are not daemons
would end the run without a word, send its files elsewhere or write them unreadable, keep it from ever ending, or
surface much later as a traceback from the bench's own code; here each is a :class:`~runtime.errors.UsageError`
naming the module and what it did, raised as its import returns (:func:`import_guarded`). Exit handlers it registers
(``atexit``, its own or a library's) are allowed and named in :data:`EXIT_HANDLERS`: the console script keeps Ctrl-C
and SIGTERM able to end a run whose handler never returns (:mod:`bench.entry`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import resource
import sys
import threading
from typing import Callable, TypeVar

from .errors import UsageError
from .user_code import ProcessExit, process_exit_refused

T = TypeVar("T")
LIMITS = {"RLIMIT_FSIZE": "the file size limit", "RLIMIT_NOFILE": "the open files limit",
          "RLIMIT_AS": "the address space limit", "RLIMIT_DATA": "the data size limit"}
"""The process's resource limits a module may change (``resource.setrlimit``) that would cut the run's files short
or fail it later in the bench's own code (probe 9: a file size limit left a cut row)."""
STREAMS = ("stdin", "stdout", "stderr")
WHAT_IT_IS_FOR = "a module given to the bench registers presses or allocators and returns"
LINGERING: list[threading.Thread] = []
"""Threads a user's import started and did not make daemons (refused): the console script ends without waiting for
them (:mod:`bench.entry`), as Python's own shutdown would wait for ever."""
EXIT_HANDLERS: list[str] = []
"""The user's imports (as messages name them) that registered ``atexit`` handlers: they run after the command, where
the console script otherwise ignores Ctrl-C and SIGTERM (:mod:`bench.entry`)."""


class _StreamStandIn:
    """A standard stream as the user's module sees it while imported: writes reach the stream, closing it only marks
    it closed (the bench's own stream stays open to print the refusal)."""

    def __init__(self, stream):
        self._stream, self.closed = stream, False

    def __getattr__(self, attribute):
        return getattr(self._stream, attribute)

    def close(self) -> None:
        self.closed = True


def _put_back(saved: dict, stand_ins: dict) -> list[str]:
    """The standard streams of ``saved`` put back; the names of those the module closed or replaced."""
    changed = [f"sys.{name}" for name, stand_in in stand_ins.items()
               if getattr(sys, name) is not stand_in or stand_in.closed]
    for name, stream in saved.items():
        setattr(sys, name, stream)
    return changed


def _descriptor(fd: int) -> tuple | None:
    """What file descriptor ``fd`` is open on (its device and inode), or None where it is closed."""
    try:
        stat = os.fstat(fd)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def _descriptors_put_back(saved: dict[int, tuple[int, tuple]]) -> list[int]:
    """Each standard descriptor of ``saved`` (``{fd: (a copy of it, what it was open on)}``) that was closed or
    pointed elsewhere, put back from its copy; their numbers. The copies are closed."""
    changed = [fd for fd, (_, was) in saved.items() if _descriptor(fd) != was]
    for fd, (copy, _) in saved.items():
        if fd in changed:
            os.dup2(copy, fd)
        os.close(copy)
    return changed


def _modules_put_back(modules: dict) -> tuple[list[str], list[str]]:
    """``sys.modules`` put back to hold each module of ``modules`` (imported before) and no None added since (an
    import blocked for the rest of the run); the names of those replaced or removed, and of those blocked."""
    replaced = sorted(name for name, module in modules.items() if sys.modules.get(name) is not module)
    blocked = sorted(name for name, module in sys.modules.items() if name not in modules and module is None)
    sys.modules.update({name: modules[name] for name in replaced})
    for name in blocked:
        del sys.modules[name]
    return replaced, blocked


def _umask() -> int:
    """The process's file mode mask (reading it means setting it: it is put straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def import_guarded(load: Callable[[], T], shown: str) -> T:
    """``load()`` (an import of a user's code, ``shown`` as the message names it), refusing in one
    :class:`~runtime.errors.UsageError` an import that exits the process, closes or replaces a standard stream (it
    sees stand-ins that only mark a close) or its file descriptor, replaces, removes or blocks modules, changes the
    working directory or the file mode mask, lowers the recursion limit (the bench's own imports would fail), raises
    a :class:`BaseException` that is no :class:`Exception` (but Ctrl-C's) or leaves threads running that are not
    daemons. Each is put back first (but the threads, named in :data:`LINGERING`), so that the refusal prints; an
    :class:`Exception` ``load`` raises goes on up unchanged, all put back too."""
    modules, cwd, threads = dict(sys.modules), os.getcwd(), set(threading.enumerate())
    mask, depth, handlers = _umask(), sys.getrecursionlimit(), atexit._ncallbacks()
    limits = {name: resource.getrlimit(getattr(resource, name)) for name in LIMITS}
    descriptors = {fd: (os.dup(fd), was) for fd in range(len(STREAMS)) if (was := _descriptor(fd)) is not None}
    streams = {name: getattr(sys, name) for name in STREAMS if getattr(sys, name) is not None}
    stand_ins = {name: _StreamStandIn(stream) for name, stream in streams.items()}
    for name, stand_in in stand_ins.items():
        setattr(sys, name, stand_in)
    try:
        with process_exit_refused():
            loaded = load()
    except ProcessExit as called:
        raise UsageError(f"{shown}: importing it called os._exit({called.status!r}); {WHAT_IT_IS_FOR}") from None
    except SystemExit as called:
        raise UsageError(f"{shown}: importing it called sys.exit({called.code!r}); {WHAT_IT_IS_FOR}") from None
    except BaseException as raised:
        if isinstance(raised, (Exception, KeyboardInterrupt)):
            raise
        raise UsageError(f"{shown}: importing it raised {type(raised).__name__}: {' '.join(str(raised).split())}; "
                         f"{WHAT_IT_IS_FOR}") from None
    finally:
        changed = _put_back(streams, stand_ins) + [f"file descriptor {fd} ({STREAMS[fd]})"
                                                   for fd in _descriptors_put_back(descriptors)]
        replaced, blocked = _modules_put_back(modules)
        moved = os.getcwd() != cwd
        os.chdir(cwd)  # the outputs were checked from here, and relative paths are the user's from here
        masked = os.umask(mask) != mask
        lowered = sys.getrecursionlimit() < depth
        sys.setrecursionlimit(max(depth, sys.getrecursionlimit()))  # a raised limit is the module's own need
        limited = [name for name, was in limits.items() if resource.getrlimit(getattr(resource, name)) != was]
        for name in limited:
            with contextlib.suppress(ValueError, OSError):  # a lowered hard limit cannot be raised again unprivileged
                resource.setrlimit(getattr(resource, name), limits[name])
    if changed:
        raise UsageError(f"{shown}: importing it closed or replaced {', '.join(changed)}; {WHAT_IT_IS_FOR}")
    if replaced or blocked:
        names = ", ".join((replaced or blocked)[:3]) + (" …" if len(replaced or blocked) > 3 else "")
        raise UsageError(f"{shown}: importing it {'replaced or removed' if replaced else 'blocked'} module(s) "
                         f"{names} in sys.modules; {WHAT_IT_IS_FOR}")
    if limited:
        raise UsageError(f"{shown}: importing it changed {', '.join(LIMITS[name] for name in limited)} "
                         f"(resource.setrlimit: the run's files could be cut short); {WHAT_IT_IS_FOR}")
    if masked:
        raise UsageError(f"{shown}: importing it changed the file mode mask (os.umask: the outputs would be written "
                         f"with other permissions); {WHAT_IT_IS_FOR}")
    if lowered:
        raise UsageError(f"{shown}: importing it lowered the recursion limit below {depth} (the bench's own imports "
                         f"would fail); {WHAT_IT_IS_FOR}")
    if moved:
        raise UsageError(f"{shown}: importing it changed the working directory (every relative path given is from "
                         f"where the command was started); {WHAT_IT_IS_FOR}")
    running = [t for t in threading.enumerate() if t not in threads and not t.daemon]
    if running:
        LINGERING.extend(running)
        raise UsageError(f"{shown}: importing it started thread(s) {', '.join(t.name for t in running)} that are not "
                         "daemons, which would keep the run from ever ending; start them with daemon=True, or not on "
                         "import")
    if atexit._ncallbacks() > handlers:
        EXIT_HANDLERS.append(shown)
    return loaded

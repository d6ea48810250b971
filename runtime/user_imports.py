"""Importing a user's code (``--import MODULE``, an installed package's entry point) so that what it does to the
process while it is imported is one line naming it.

A module that registers a press runs in the bench's own process. Exiting there (``sys.exit``, ``os._exit``,
``posix._exit``, ``os.exec*``), closing or replacing the standard streams or their descriptors, replacing a module
already imported, changing how the run is stopped (signal handlers), moving the working directory, changing the
file mode mask, lowering the recursion limit or leaving threads that are not daemons would end the run without a
word, send its files elsewhere or write them unreadable, keep it from ever ending, or surface much later as a
traceback from the bench's own code; here each is a :class:`~runtime.errors.UsageError` naming the module and what
it did, raised as its import returns (:func:`import_guarded`). Exit handlers it registers (``atexit``, its own or a
library's) are allowed and named in :data:`EXIT_HANDLERS`: the console script keeps Ctrl-C and SIGTERM able to end a
run whose handler never returns (:mod:`bench.entry`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import resource
import sys
from typing import Callable, TypeVar

from .errors import UsageError
from .process_guard import HeldProcess, ProcessExit

T = TypeVar("T")
LIMITS = {"RLIMIT_FSIZE": "the file size limit", "RLIMIT_NOFILE": "the open files limit",
          "RLIMIT_AS": "the address space limit", "RLIMIT_DATA": "the data size limit"}
"""The process's resource limits a module may change (``resource.setrlimit``) that would cut the run's files short
or fail it later in the bench's own code (probe 9: a file size limit left a cut row)."""
WHAT_IT_IS_FOR = "a module given to the bench registers presses or allocators and returns"
EXIT_HANDLERS: list[str] = []
"""The user's imports (as messages name them) that registered ``atexit`` handlers: they run after the command, where
the console script otherwise ignores Ctrl-C and SIGTERM (:mod:`bench.entry`)."""


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
    handlers of the signals that stop a run, the working directory or the file mode mask, lowers the recursion limit
    (the bench's own imports would fail), raises a :class:`BaseException` that is no :class:`Exception` (but
    Ctrl-C's) or leaves threads running that are not daemons (what the process holds:
    :class:`~runtime.process_guard.HeldProcess`). Each is put back first (but the threads: the console script ends
    without waiting for them, :mod:`bench.entry`), so that the refusal prints; an :class:`Exception` ``load`` raises
    goes on up unchanged, all put back too."""
    modules, mask, depth, handlers = dict(sys.modules), _umask(), sys.getrecursionlimit(), atexit._ncallbacks()
    limits = {name: resource.getrlimit(getattr(resource, name)) for name in LIMITS}
    held = HeldProcess(shown)
    try:
        with held:
            loaded = load()
    except ProcessExit as called:
        raise UsageError(f"{shown}: importing it called {called.how}; {WHAT_IT_IS_FOR}") from None
    except SystemExit as called:
        raise UsageError(f"{shown}: importing it called sys.exit({called.code!r}); {WHAT_IT_IS_FOR}") from None
    except BaseException as raised:
        if isinstance(raised, (Exception, KeyboardInterrupt)):
            raise
        raise UsageError(f"{shown}: importing it raised {type(raised).__name__}: {' '.join(str(raised).split())}; "
                         f"{WHAT_IT_IS_FOR}") from None
    finally:
        replaced, blocked = _modules_put_back(modules)
        masked = os.umask(mask) != mask
        lowered = sys.getrecursionlimit() < depth
        sys.setrecursionlimit(max(depth, sys.getrecursionlimit()))  # a raised limit is the module's own need
        limited = [name for name, was in limits.items() if resource.getrlimit(getattr(resource, name)) != was]
        for name in limited:
            with contextlib.suppress(ValueError, OSError):  # a lowered hard limit cannot be raised again unprivileged
                resource.setrlimit(getattr(resource, name), limits[name])
    if held.streams:
        raise UsageError(f"{shown}: importing it closed or replaced {', '.join(held.streams)}; {WHAT_IT_IS_FOR}")
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
    if held.signals:
        raise UsageError(f"{shown}: importing it changed {', '.join(held.signals)} (Ctrl-C and SIGTERM must stay "
                         f"able to stop the run); {WHAT_IT_IS_FOR}")
    if held.moved:
        raise UsageError(f"{shown}: importing it changed the working directory (every relative path given is from "
                         f"where the command was started); {WHAT_IT_IS_FOR}")
    if held.lingering:
        raise UsageError(f"{shown}: importing it started thread(s) {', '.join(t.name for t in held.lingering)} that "
                         "are not daemons, which would keep the run from ever ending; start them with daemon=True, or "
                         "not on import")
    if atexit._ncallbacks() > handlers:
        EXIT_HANDLERS.append(shown)
    return loaded

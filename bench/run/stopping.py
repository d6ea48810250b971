"""How a ``bench`` command stops: Ctrl-C, SIGTERM (``timeout``, ``kill``) and SIGHUP (a closed terminal, a dropped
ssh session) raised as an interrupt, each ending the command with one line and its exit code. Imports nothing
heavy: the console script (:mod:`bench.entry`) sets it up before the command's modules load."""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import suppress


class Terminated(KeyboardInterrupt):
    """SIGTERM raised as an interrupt, so that what a command cleans up on Ctrl-C — a half-converted model's
    temporary folder, a store's lock — is cleaned up on it too."""


class HungUp(Terminated):
    """SIGHUP (its terminal closed) raised as an interrupt, cleaned up after as SIGTERM is."""


class WorkerDied(RuntimeError):
    """A worker process of a run ended without an answer or an error of its own: killed from outside (SIGKILL, the
    out-of-memory killer). Not a bug: what was finished is kept, and the same command resumes the run."""


def _terminate(signum, frame) -> None:
    raise HungUp if signum == signal.SIGHUP else Terminated


def stopped(stop: KeyboardInterrupt, who: str, what_is_kept: str) -> int:
    """Print how ``who`` (``bench compare``) stopped and ``what_is_kept`` (where standard error is still there to
    take it: after a hang-up it may be gone); the exit code: 129 for SIGHUP, 143 for SIGTERM, 130 for Ctrl-C."""
    how = "hung up" if isinstance(stop, HungUp) else "terminated" if isinstance(stop, Terminated) else "interrupted"
    with suppress(OSError, ValueError):
        print(f"\n{who}: {how}; {what_is_kept}", file=sys.stderr)
    return 129 if isinstance(stop, HungUp) else 143 if isinstance(stop, Terminated) else 130


class StopOnSignals:
    """SIGTERM and SIGHUP raised as :class:`Terminated` and :class:`HungUp` inside the ``with`` block, the handlers
    before it restored after; a no-op outside the main thread (where a handler cannot be set: a caller may run the
    bench in another)."""

    def __enter__(self):
        main = threading.current_thread() is threading.main_thread()
        self.previous = {number: signal.signal(number, _terminate) for number in RAISED} if main else {}
        return self

    def __exit__(self, *exc) -> None:
        for number, handler in self.previous.items():
            signal.signal(number, handler)


RAISED = (signal.SIGTERM, signal.SIGHUP)
"""The signals :class:`StopOnSignals` raises as interrupts (Ctrl-C's SIGINT is one already)."""

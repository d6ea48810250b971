"""How a ``bench`` command stops: Ctrl-C, and SIGTERM (``timeout``, ``kill``) raised as an interrupt, each ending the
command with one line and its exit code. Imports nothing heavy: the console script (:mod:`bench.entry`) sets it up
before the command's modules load."""

from __future__ import annotations

import signal
import sys
import threading


class Terminated(KeyboardInterrupt):
    """SIGTERM raised as an interrupt, so that what a command cleans up on Ctrl-C — a half-converted model's
    temporary folder, a store's lock — is cleaned up on it too."""


class WorkerDied(RuntimeError):
    """A worker process of a run ended without an answer or an error of its own: killed from outside (SIGKILL, the
    out-of-memory killer). Not a bug: what was finished is kept, and the same command resumes the run."""


def _terminate(signum, frame) -> None:
    raise Terminated


def stopped(stop: KeyboardInterrupt, who: str, what_is_kept: str) -> int:
    """Print how ``who`` (``bench compare``) stopped and ``what_is_kept``; the exit code: 143 for SIGTERM, 130 for
    Ctrl-C."""
    how = "terminated" if isinstance(stop, Terminated) else "interrupted"
    print(f"\n{who}: {how}; {what_is_kept}", file=sys.stderr)
    return 143 if isinstance(stop, Terminated) else 130


class StopOnSignals:
    """SIGTERM raised as :class:`Terminated` inside the ``with`` block, the handler before it restored after; a no-op
    outside the main thread (where a handler cannot be set: a caller may run the bench in another)."""

    def __enter__(self):
        main = threading.current_thread() is threading.main_thread()
        self.previous = signal.signal(signal.SIGTERM, _terminate) if main else None
        return self

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)

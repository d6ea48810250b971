"""Stops held back for a moment: a few renames that must land together, or processes started that must not inherit
a terminal's Ctrl-C."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

STOPS = (signal.SIGINT, signal.SIGTERM)
"""Ctrl-C, and SIGTERM (``timeout``, ``kill``): the signals a ``bench`` command stops on."""


@contextmanager
def held(signals=STOPS) -> Iterator[None]:
    """``signals`` blocked in this thread inside the ``with`` block, and raised (their handlers run) as it ends.

    Keep the block to what must not be cut in two, and free of anything that may wait (a print to a paused terminal):
    a blocked SIGTERM cannot stop it. A process started inside inherits the blocked signals (a worker then never sees
    a terminal's Ctrl-C, which reaches its whole process group; its driver stops it)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, set(signals))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)

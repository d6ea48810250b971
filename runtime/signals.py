"""Stops held back for a moment: a few renames that must land together, or processes started that must not see a
terminal's Ctrl-C."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Ctrl-C, SIGTERM (``timeout``, ``kill``) and SIGHUP (a closed terminal): the signals a ``bench`` command stops on."""


@contextmanager
def held(signals=STOPS) -> Iterator[None]:
    """``signals`` that come inside the ``with`` block recorded, and raised again as it ends (their handlers of
    before then run: a stop becomes an interrupt there).

    Python runs a signal's handler in the main thread, whichever thread the kernel gave it to (torch starts several):
    the handlers are swapped, not the thread's signal mask. Keep the block to what must not be cut in two, and free
    of anything that may wait (a print to a paused terminal): no stop ends it. A no-op outside the main thread, where
    no handler runs and so no stop cuts in."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = {number: signal.signal(number, lambda number, frame: came.append(number)) for number in signals}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for number in dict.fromkeys(came):
            signal.raise_signal(number)


@contextmanager
def kept_from_children(signals=(signal.SIGINT,)) -> Iterator[None]:
    """``signals`` ignored in the processes started inside the ``with`` block (a worker then never sees a terminal's
    Ctrl-C, which reaches its whole process group; its driver stops it). An ignored signal stays ignored through
    ``exec``, where a blocked mask does not: a spawned Python starts with none blocked (probe 28, #3: a worker's
    ``KeyboardInterrupt`` traceback while it imported the bench). This process ignores them too meanwhile: keep the
    block to the starts themselves (milliseconds), as one that comes then is lost. Only in the main thread, where
    Python sets handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handlers = {number: signal.signal(number, signal.SIG_IGN) for number in signals}
    try:
        yield
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)

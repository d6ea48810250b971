"""How the driver of ``bench compare --jobs N`` watches its worker processes: each beats on its pipe, one silent too
long (stopped with ``kill -STOP``, or wedged with the interpreter held: it never ends, so no end of file comes) is
named and killed, and jobs go to each worker on a pipe of its own."""

from __future__ import annotations

import os
import queue
import threading
import time

from runtime.errors import UsageError

from .stopping import WorkerDied

BEAT_SECONDS = 1.0
"""How often a worker tells its driver it is there, whatever it is doing (a thread of its own)."""
SILENCE_ENV = "HYBRIDPRESS_WORKER_SILENCE"
"""Seconds a worker may stay silent (no beat, no rows) before the driver takes it as stopped or wedged (default
:data:`SILENCE_SECONDS`): a worker stopped with ``kill -STOP`` or stuck with the interpreter held never ends, so its
end of file never comes."""
SILENCE_SECONDS = 120.0
"""How long, by default."""
STARTUP_SECONDS = 600.0
"""How long a worker may take to send its first beat: starting, it imports torch and unpickles the run."""
LOOK_SECONDS = 2 * BEAT_SECONDS
"""The longest the driver's loop runs between two looks at its clock, running: it waits at most
:data:`BEAT_SECONDS` for a message, then reads what came. A longer gap is time it was not running."""


class WatchClock:
    """Seconds the driver has watched its workers: a clock that a stop of the driver does not advance.

    Ctrl-Z stops the whole process group, driver and workers, and ``fg`` continues it (probe 13: a healthy run was
    then killed, each worker "silent" for as long as the driver had itself been stopped, on ``time.monotonic``,
    which runs on while a process is stopped). No clock of the system leaves out the time a process was stopped,
    and a SIGCONT handler would be the driver's to install, in its main thread alone. The driver looks at this clock
    at least every :data:`LOOK_SECONDS` while it runs, so each look adds the time since the last one, but never more
    than :data:`LOOK_SECONDS`: a gap longer than that (stopped, or kept from the processor) is time no silence could
    be seen in, and counts as one look. A worker stopped alone (``kill -STOP``) is still silent on it while the
    driver runs, so it is caught as before, at most a look later."""

    def __init__(self):
        self._real, self._watched = time.monotonic(), 0.0

    def __call__(self) -> float:
        """The seconds watched so far."""
        real = time.monotonic()
        self._watched += min(real - self._real, LOOK_SECONDS)
        self._real = real
        return self._watched


class Feeder:
    """The jobs of one worker, sent on its own pipe by a thread of the driver: a job larger than the pipe (the keys
    of a resumed context's rows) would block the driver while the worker computes, and the worker, its rows sent to
    a driver that does not read, would block too. A pipe a worker, not one queue for all: a queue's named
    semaphores are the resource tracker's to unlink, which a killed tracker turned into raw ``KeyError``
    tracebacks at exit."""

    def __init__(self, writer):
        self.writer, self.jobs, self.due = writer, queue.SimpleQueue(), 0
        threading.Thread(target=self._send, name="feeder", daemon=True).start()

    due: int
    """The jobs put that the worker has not answered yet (the driver counts them down as rows come)."""

    def put(self, job) -> None:
        """Send ``job`` (a :class:`~bench.run.execution.ContextJob`, or None: no more) after those put before."""
        self.due += job is not None
        self.jobs.put(job)

    def _send(self) -> None:
        while True:
            job = self.jobs.get()
            try:
                self.writer.send(job)
            except (OSError, ValueError):  # the worker ended, or the driver closed the pipe as the run ends
                return
            if job is None:
                return


def silence_limit() -> float:
    """:data:`SILENCE_ENV` in seconds, else :data:`SILENCE_SECONDS`; a :class:`UsageError` for a value that is no
    positive number."""
    given = os.environ.get(SILENCE_ENV)
    if given is None:
        return SILENCE_SECONDS
    try:
        seconds = float(given)
    except ValueError:
        seconds = float("nan")
    if not (0 < seconds < float("inf")):
        raise UsageError(f"{SILENCE_ENV}={given!r}: give the seconds a worker may stay silent, a positive number")
    return seconds


def raise_if_silent(names: dict, heard: dict, started: float, limit: float, now: float, starting: str = "") -> None:
    """A :class:`WorkerDied` naming (``names``: each worker's key to how it is named, ``worker process 41``) the first
    worker still running that has sent nothing (no beat, no rows) for ``limit`` seconds since its last message
    (``heard``, by its key; None before its first): stopped (``kill -STOP``) or wedged, it would be waited on for
    ever. Its first beat comes once it has imported torch, which a busy machine may take long over: it is allowed
    :data:`STARTUP_SECONDS` (or ``limit``, if longer) from ``started``, and ``starting`` is said of one silent since
    then (where its own words went). Every time is read on one :class:`WatchClock` (``now``: its reading now)."""
    for key, name in names.items():
        last = heard[key]
        silent, allowed = (now - last, limit) if last is not None else (now - started, max(limit, STARTUP_SECONDS))
        if silent > allowed:
            limit_said = (f"{SILENCE_ENV} sets how long a worker may stay silent" if last is not None else
                          f"a worker still starting may take {max(limit, STARTUP_SECONDS):g} s to send its first "
                          f"beat, {STARTUP_SECONDS:g} s or {SILENCE_ENV} if longer")
            raise WorkerDied(f"{name} has sent nothing for {allowed:g} s"
                             f"{'' if last is not None else ' since it started'} (stopped, as by kill -STOP, or "
                             f"wedged; {limit_said}{'; ' + starting if starting and last is None else ''}): it was "
                             "killed, and the run ended")


def end_worker(process) -> None:
    """End a worker: SIGTERM, then SIGKILL if it is still there a few seconds later (a stopped process leaves a
    SIGTERM pending for ever: only SIGKILL ends it)."""
    if process.is_alive():
        process.terminate()
        process.join(5.0)
    if process.is_alive():
        process.kill()
    process.join()

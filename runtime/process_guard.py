"""A user's code run in the bench's own process held to leave the process as it found it: a press's or allocator's
method (:func:`runtime.user_code.run_users`) and an ``--import``ed module (:func:`runtime.user_imports.import_guarded`).

Such code runs among the bench's own state: ending the process (``os._exit``, ``posix._exit``, ``os.abort``, an
``os.exec*``), closing or replacing its standard streams or their descriptors, changing its handlers of (or blocking)
SIGINT, SIGTERM and SIGHUP, moving its working directory, or leaving a thread that is not a daemon running ended a
run with status 0 and only its ``.lock`` (probe 13), lost its summary, made it deaf to Ctrl-C, sent a relative
``--out`` elsewhere, or kept a finished run from ever exiting. :class:`HeldProcess` holds each of these around the
code: an exit raises :class:`ProcessExit` in its place, and what was changed is put back as the code returns (but a
thread, which cannot be stopped from outside) and named, for the caller to refuse in one line naming the code.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import posix
import signal
import sys
import threading

STREAMS = ("stdin", "stdout", "stderr")
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that stop a run (:mod:`bench.run.stopping`): their handlers and whether they are blocked are held."""
EXITS = ("_exit", "abort", "execv", "execve")
"""What ends the process or replaces its program where it stands, in ``os`` and ``posix`` (the same functions
under two names): ``os.execl`` … ``os.execvpe`` call ``execv`` or ``execve`` through ``os``, so they are refused too.
``sys.exit`` raises ``SystemExit``, which the callers refuse themselves."""
LEFT_RUNNING: dict[threading.Thread, str] = {}
"""Threads that a user's code started and left running (daemons, or refused), to the code that started them (as
messages name it): a change found after that code returned may be theirs (:func:`threads_left`)."""


class ProcessExit(BaseException):
    """One of :data:`EXITS` called by a user's code while it is held (:func:`exits_refused`), raised in its place; a
    :class:`BaseException`, so that the user's own ``except Exception`` does not swallow it. ``how``: the call as
    made, ``os._exit(0)``."""

    def __init__(self, how: str):
        super().__init__(how)
        self.how = how


def _refusing(name: str, real, pid: int):
    """A stand-in of ``real`` (``name`` as the code calls it) raising :class:`ProcessExit`; in a child the code forked
    (``os.spawnv`` does) it is ``real`` itself, which ends the child as it should."""
    def refused(*arguments, **keywords):
        if os.getpid() != pid:
            return real(*arguments, **keywords)
        shown = ", ".join([*map(repr, arguments), *(f"{key}={value!r}" for key, value in keywords.items())])
        raise ProcessExit(f"{name}({shown})")
    return refused


@contextlib.contextmanager
def exits_refused():
    """Each of :data:`EXITS` raising :class:`ProcessExit` within, put back after: they end the process where it
    stands, without the bench's line, its ``.lock`` removed or its exit status (probes 12 and 13). Code that bound
    one to a name of its own before (``from os import _exit``, outside a held import) is not reached."""
    real = {(module, name): getattr(module, name) for module in (os, posix) for name in EXITS}
    pid = os.getpid()
    for (module, name), function in real.items():
        setattr(module, name, _refusing(f"{module.__name__}.{name}", function, pid))
    try:
        yield
    finally:
        for (module, name), function in real.items():
            setattr(module, name, function)


class _StreamStandIn:
    """A standard stream as held code sees it: writes reach the stream, closing it only marks it closed (the bench's
    own stream stays open to print the refusal)."""

    def __init__(self, stream):
        self._stream, self.closed = stream, False

    def __getattr__(self, attribute):
        return getattr(self._stream, attribute)

    def close(self) -> None:
        self.closed = True


def _descriptor(fd: int) -> tuple | None:
    """What file descriptor ``fd`` is open on (its device and inode), or None where it is closed."""
    try:
        stat = os.fstat(fd)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def _cwd() -> str | None:
    """The working directory, or None where it was removed (the bench's own paths are absolute by then)."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        return None


def threads_left() -> str:
    """Where threads a user's code left (:data:`LEFT_RUNNING`) still run: ``"; press p left thread(s) T running"``
    naming them and who started them, to add to a refusal of a change found after that code returned; else ``""``."""
    by: dict[str, list[str]] = {}
    for thread, shown in list(LEFT_RUNNING.items()):
        if thread.is_alive():
            by.setdefault(shown, []).append(thread.name)
        else:
            del LEFT_RUNNING[thread]
    return "".join(f"; {shown} left thread(s) {', '.join(names)} running" for shown, names in by.items())


class HeldProcess:
    """A ``with`` block of a user's code (``shown``: as messages name it) that leaves the process as it found it.

    Within, :data:`EXITS` raise :class:`ProcessExit` and the standard streams are stand-ins that only mark a close.
    On leaving, the streams, the standard descriptors (each from a copy taken on entering), the handlers and the
    blocked state of :data:`SIGNALS` and the working directory are put back; threads started within that still run
    are recorded in :data:`LEFT_RUNNING`. What differed is in the attributes below, for the caller to refuse.

    Attributes
    ----------
    streams : list[str]
        The streams and descriptors closed or replaced (``"sys.stdout"``, ``"file descriptor 1 (stdout)"``).
    signals : list[str]
        ``"the handler of SIGINT"``, ``"the signal mask (SIGTERM blocked)"`` …
    moved : bool
        Whether the working directory was changed.
    lingering : list[threading.Thread]
        Threads started within, still running, that are not daemons: Python's shutdown waits for them for ever.
    """

    def __init__(self, shown: str):
        self.shown = shown
        self.streams: list[str] = []
        self.signals: list[str] = []
        self.moved = False
        self.lingering: list[threading.Thread] = []

    def __enter__(self) -> HeldProcess:
        self._cwd, self._threads = _cwd(), set(threading.enumerate())
        self._handlers = {number: signal.getsignal(number) for number in SIGNALS}
        self._blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        # each copy above the standard ones: os.dup takes the lowest free, a closed stdout (`>&-`) for stdin's copy,
        # which was then taken for stdout, and closed again on leaving as a change of the held code's (probe 19)
        held = {fd: was for fd in range(len(STREAMS)) if (was := _descriptor(fd)) is not None}
        self._descriptors = {fd: (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, len(STREAMS)), was)
                             for fd, was in held.items()}
        self._streams = {name: getattr(sys, name) for name in STREAMS if getattr(sys, name) is not None}
        self._stand_ins = {name: _StreamStandIn(stream) for name, stream in self._streams.items()}
        for name, stand_in in self._stand_ins.items():
            setattr(sys, name, stand_in)
        self._exits = exits_refused()
        self._exits.__enter__()
        return self

    def __exit__(self, *raised) -> None:
        self._exits.__exit__(*raised)
        self._put_back_streams()
        self._put_back_signals()
        self.moved = _cwd() != self._cwd
        if self.moved and self._cwd is not None:  # the outputs were checked from here, and relative paths are the
            os.chdir(self._cwd)                   # user's from here
        started = [thread for thread in threading.enumerate() if thread not in self._threads]
        LEFT_RUNNING.update(dict.fromkeys(started, self.shown))
        self.lingering = [thread for thread in started if not thread.daemon]

    def _put_back_streams(self) -> None:
        self.streams = [f"sys.{name}" for name, stand_in in self._stand_ins.items()
                        if getattr(sys, name) is not stand_in or stand_in.closed]
        for name, stream in self._streams.items():
            setattr(sys, name, stream)
        for fd, (copy, was) in self._descriptors.items():
            if _descriptor(fd) != was:
                self.streams.append(f"file descriptor {fd} ({STREAMS[fd]})")
                os.dup2(copy, fd)
            os.close(copy)

    def _put_back_signals(self) -> None:
        for number, handler in self._handlers.items():
            # None: a handler not set from Python, which cannot be set back (nor changed by held code but through C)
            if signal.getsignal(number) is not handler and handler is not None:
                self.signals.append(f"the handler of {signal.Signals(number).name}")
                signal.signal(number, handler)  # changed, so this is the main thread: only it can set one
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        newly = sorted((blocked - self._blocked) & set(SIGNALS))
        if newly:
            self.signals.append(f"the signal mask ({', '.join(signal.Signals(n).name for n in newly)} blocked)")
        if blocked != self._blocked:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._blocked)

    def changes(self) -> tuple[str, str] | None:
        """What the held code changed of the process (put back), as a message says it after the code's name, and
        why that matters: ``("closed or replaced sys.stdout", "…")``, the first kind of change only; None if
        nothing."""
        if self.streams:
            return f"closed or replaced {', '.join(self.streams)}", "the run's own lines are written there"
        if self.signals:
            return f"changed {', '.join(self.signals)}", "Ctrl-C and SIGTERM must stay able to stop the run"
        if self.moved:
            return "changed the working directory", "every relative path given is from where the command was started"
        if self.lingering:
            return (f"left thread(s) {', '.join(t.name for t in self.lingering)} running that are not daemons",
                    "they would keep the run from ever ending")
        return None

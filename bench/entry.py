"""The ``bench`` console script: Ctrl-C or SIGTERM (``timeout``, ``kill``) end it with one line at any moment, while
the command's modules load (seconds: torch, transformers) as during the command (:func:`bench.commands.cli.main`,
:mod:`bench.run.stopping`). This module imports nothing heavy, so that it is in place before they load."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time

from bench.run.stopping import StopOnSignals, stopped

LINGER_SECONDS = 2.0
"""How long the console script waits, once its command is done, for threads that are not daemons to end."""


def _stop_in_exit_handlers(handlers: list[str], code: int):
    """A signal handler ending the process at once, with one line, while the exit handlers that ``handlers`` (the
    user's imports, as named) registered run after a command that ended with ``code``."""
    def stop(signum, frame):
        os.write(2, f"bench: stopped ({signal.Signals(signum).name}) while the exit handlers registered by "
                    f"{', '.join(handlers)} ran, after the command had ended (exit code {code}): what it wrote is "
                    "kept\n".encode())
        os._exit(128 + signum)
    return stop


def main() -> int:
    """``bench`` from the shell: :func:`bench.commands.cli.main`, imported under :class:`StopOnSignals`."""
    with StopOnSignals():
        try:
            from bench.commands.cli import main as run
        except KeyboardInterrupt as stop:
            return stopped(stop, "bench", "it stopped while starting, before any work: nothing was written")
        code = run()
    user_imports = sys.modules.get("runtime.user_imports")
    handlers = user_imports.EXIT_HANDLERS if user_imports is not None else []
    # the command is done and has said so: a stop in the moments of shutdown left (~0.3 s) would only change the
    # exit code, with no line to say why; but a user's exit handler may never return, and a stop must still end it
    if handlers:  # what the command printed, out before a stop in them ends the process without Python's flush
        sys.stdout.flush()
        sys.stderr.flush()
    for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, _stop_in_exit_handlers(handlers, code) if handlers else signal.SIG_IGN)
    left = [thread for thread in threading.enumerate() if not thread.daemon and thread is not threading.main_thread()]
    deadline = time.monotonic() + LINGER_SECONDS
    for thread in left:  # one that is ending (a library's, shutting down) ends as Python's shutdown would wait for it
        thread.join(max(0.0, deadline - time.monotonic()))
    left = [thread for thread in left if thread.is_alive()]
    if left:
        # a thread that is not a daemon, left by user code (refused and said where it was seen) or by anything else:
        # Python's shutdown would wait for it for ever, past the signals ignored above (probe 13). The exit handlers
        # run as Python would run them, then the process ends without waiting
        with contextlib.suppress(OSError, ValueError):  # a stream closed by that code is no reason to hang
            if code == 0:
                print(f"bench: thread(s) {', '.join(thread.name for thread in left)} that are not daemons still ran "
                      "after the command ended; it ends without waiting for them", file=sys.stderr)
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())

"""The ``bench`` console script: Ctrl-C or SIGTERM (``timeout``, ``kill``) end it with one line at any moment, while
the command's modules load (seconds: torch, transformers) as during the command (:func:`bench.commands.cli.main`,
:mod:`bench.run.stopping`). This module imports nothing heavy, so that it is in place before they load."""

from __future__ import annotations

import os
import signal
import sys

from bench.run.stopping import StopOnSignals, stopped


def main() -> int:
    """``bench`` from the shell: :func:`bench.commands.cli.main`, imported under :class:`StopOnSignals`."""
    with StopOnSignals():
        try:
            from bench.commands.cli import main as run
        except KeyboardInterrupt as stop:
            return stopped(stop, "bench", "it stopped while starting, before any work: nothing was written")
        code = run()
    # the command is done and has said so: a stop in the moments of shutdown left (~0.3 s) would only change the
    # exit code, with no line to say why
    for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, signal.SIG_IGN)
    user_imports = sys.modules.get("runtime.user_imports")
    if user_imports is not None and any(thread.is_alive() for thread in user_imports.LINGERING):
        # a user's module left threads running (refused, said): Python's shutdown would wait for them for ever, past
        # the signals ignored above
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())

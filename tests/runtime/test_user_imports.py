"""What a user's import may do to the process (:mod:`runtime.user_imports`), the cases of probe round 8: exceptions
that are no ``Exception``, the file mode mask, the recursion limit and exit handlers."""

import atexit
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime import user_imports
from runtime.errors import UsageError
from runtime.user_imports import import_guarded


class Weird(BaseException):
    """What a module may raise that is neither an ``Exception`` nor a request to stop."""


def _raising(error):
    def load():
        raise error
    return load


@pytest.mark.parametrize("error, says", [(Weird("boom"), "raised Weird: boom"),
                                         (GeneratorExit(), "raised GeneratorExit: ")])
def test_a_base_exception_from_an_import_is_one_line(error, says):
    """Probe 8: a module raising a BaseException subclass (or GeneratorExit) gave a raw traceback."""
    with pytest.raises(UsageError, match=f"--import m: importing it {says}"):
        import_guarded(_raising(error), "--import m")


@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("own")])
def test_ctrl_c_and_exceptions_go_on_up_unchanged(error):
    with pytest.raises(type(error)):
        import_guarded(_raising(error), "--import m")


def test_an_import_that_changes_the_file_mode_mask_is_refused_and_the_mask_put_back():
    """Probe 8: a module calling os.umask(0o777) left the store written with mode 000."""
    before = os.umask(0o022)
    os.umask(before)
    with pytest.raises(UsageError, match=r"--import m: importing it changed the file mode mask \(os.umask"):
        import_guarded(lambda: os.umask(0o777), "--import m")
    after = os.umask(0o022)
    os.umask(after)
    assert after == before


def test_a_lowered_recursion_limit_is_refused_and_put_back_a_raised_one_kept():
    """Probe 8: sys.setrecursionlimit(50) in a module surfaced as transformers failing to import AutoConfig."""
    depth = sys.getrecursionlimit()
    try:
        with pytest.raises(UsageError, match=f"lowered the recursion limit below {depth}"):
            import_guarded(lambda: sys.setrecursionlimit(50), "--import m")
        assert sys.getrecursionlimit() == depth
        import_guarded(lambda: sys.setrecursionlimit(depth + 1000), "--import m")
        assert sys.getrecursionlimit() == depth + 1000
    finally:
        sys.setrecursionlimit(depth)


def test_exit_handlers_an_import_registers_are_allowed_and_named(monkeypatch):
    monkeypatch.setattr(user_imports, "EXIT_HANDLERS", [])

    def handler():
        pass

    try:
        import_guarded(lambda: atexit.register(handler), "--import m")
        import_guarded(lambda: None, "--import quiet")
    finally:
        atexit.unregister(handler)
    assert user_imports.EXIT_HANDLERS == ["--import m"]


@pytest.mark.slow  # a process of its own: CI's slow run holds it
def test_a_run_whose_imported_exit_handler_never_returns_still_ends_on_sigterm(tmp_path):
    """Probe 8: an exit handler sleeping for ever kept the process past SIGTERM, Ctrl-C and SIGHUP (the console
    script ignores them once its command is done): only SIGKILL ended it."""
    (tmp_path / "lingering.py").write_text("import atexit, time\natexit.register(time.sleep, 1000)\n")
    run = subprocess.Popen([sys.executable, "-m", "bench.entry", "compare", "--press", "keydiff", "--n", "1",
                            "--out", str(tmp_path / "out"), "--import", "lingering"], cwd=tmp_path,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "out" / "summary.md").exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(2)  # the command returns and the handler starts its sleep
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=30)
    finally:
        run.kill()
    assert run.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == ("bench: stopped (SIGTERM) while the exit handlers registered by --import "
                                            "lingering ran, after the command had ended (exit code 0): what it wrote "
                                            "is kept"), err
    assert "results:" in out and (tmp_path / "out" / "results.jsonl").read_text().count("\n") >= 1


def test_an_import_that_changes_a_resource_limit_is_refused_and_the_limit_put_back():
    """Probe 9: a module setting RLIMIT_FSIZE made compare end in 'OSError: File too large', a row cut short."""
    import resource

    before = resource.getrlimit(resource.RLIMIT_FSIZE)
    with pytest.raises(UsageError, match=r"--import m: importing it changed the file size limit \(resource.setrlimit"):
        import_guarded(lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (4096, before[1])), "--import m")
    assert resource.getrlimit(resource.RLIMIT_FSIZE) == before

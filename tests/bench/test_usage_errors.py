"""What the user can fix is one line and exit 2 (``--debug``: with its traceback); anything else is a bug and shows
its traceback."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import bench.run.compare
from bench.commands.cli import main
from runtime.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]


def _bad_press(tmp_path):
    return ["compare", "--press", "nosuch", "--out", str(tmp_path / "out")]


def test_a_usage_error_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(_bad_press(tmp_path)) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [err.strip()] and err.startswith("bench compare: error: unknown press 'nosuch'")
    assert "Traceback" not in err


def test_debug_shows_the_traceback_of_a_usage_error(tmp_path, capsys):
    assert main([*_bad_press(tmp_path), "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "UsageError: unknown press 'nosuch'" in err
    assert err.strip().splitlines()[-1].startswith("bench compare: error: unknown press 'nosuch'")


def test_a_missing_file_the_user_named_is_a_usage_error(tmp_path, capsys):
    def missing(settings):
        raise FileNotFoundError(2, "No such file or directory", str(tmp_path / "out" / "results.jsonl.gz"))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bench.run.compare, "plan", missing)
        assert main(["compare", "--press", "keydiff", "--out", str(tmp_path / "out")]) == 2
    assert "No such file or directory" in capsys.readouterr().err


@pytest.mark.parametrize("error", [ValueError("an internal mismatch"), KeyError("internal"),
                                   FileNotFoundError(2, "No such file or directory", "/nowhere/the/code/looked")])
def test_an_internal_error_propagates(tmp_path, monkeypatch, error):
    def bug(settings):
        raise error

    monkeypatch.setattr(bench.run.compare, "plan", bug)
    with pytest.raises(type(error)):
        main(["compare", "--press", "keydiff", "--out", str(tmp_path / "out")])


@pytest.mark.slow  # ~5 s: a process of its own; CI's slow run holds it
def test_an_internal_error_is_a_traceback_and_a_nonzero_exit(tmp_path):
    script = ("import sys, bench.run.compare\n"
              "def bug(settings):\n    raise ValueError('an unpacking mismatch')\n"
              "bench.run.compare.plan = bug\n"
              "from bench.commands.cli import main\n"
              f"sys.exit(main(['compare', '--press', 'keydiff', '--out', {str(tmp_path / 'out')!r}]))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode not in (0, 2)
    assert "Traceback (most recent call last)" in done.stderr and "ValueError: an unpacking mismatch" in done.stderr
    assert "bench compare: error" not in done.stderr


def test_usage_error_is_a_value_error():
    assert issubclass(UsageError, ValueError)
    with pytest.raises(UsageError, match="unknown allocator"):
        __import__("allocators").get("nosuch")
    with pytest.raises(UsageError, match="expected an integer"):
        __import__("presses").get("snapkv", window="8.5")

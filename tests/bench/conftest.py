"""What the bench's tests of refusals share: ``guarded``, under which a command that starts its work fails the test,
and ``chattr``, which protects a file as only an attribute does."""

import shutil
import subprocess

import pytest

import bench.commands.fetch_command
import hybridmodel.delta_artifacts
import hybridmodel.hybrid_delta
import hybridmodel.train


@pytest.fixture
def guarded(monkeypatch, no_model_load):
    """Nothing past a command's checks runs: no model loads, trains, downloads or is rebuilt."""
    def fail(*args, **kwargs):
        pytest.fail("the command started its work before refusing its input")

    monkeypatch.setattr(bench.commands.fetch_command, "fetch", fail)
    monkeypatch.setattr(hybridmodel.train, "train", fail)
    monkeypatch.setattr(hybridmodel.delta_artifacts, "ship_artifacts", fail)
    monkeypatch.setattr(hybridmodel.hybrid_delta, "rebuild", fail)


@pytest.fixture
def chattr():
    """``chattr(path, "+i")``: set a file's attribute, taken off again after the test; the test is skipped where the
    attributes cannot be set (no ``chattr``, a file system without them, no CAP_LINUX_IMMUTABLE)."""
    flagged = []

    def set_attribute(path, change):
        if shutil.which("chattr") is None or subprocess.run(["chattr", change, str(path)],
                                                             capture_output=True).returncode != 0:
            pytest.skip("file attributes cannot be set here")
        flagged.append((path, change.replace("+", "-")))

    yield set_attribute
    for path, undo in flagged:
        subprocess.run(["chattr", undo, str(path)], capture_output=True)

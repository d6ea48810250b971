"""What the bench's tests of refusals share: ``guarded``, under which a command that starts its work fails the test."""

import pytest

import bench.commands.fetch_command
import hybridmodel.hybrid_delta
import hybridmodel.train


@pytest.fixture
def guarded(monkeypatch, no_model_load):
    """Nothing past a command's checks runs: no model loads, trains, downloads or is rebuilt."""
    def fail(*args, **kwargs):
        pytest.fail("the command started its work before refusing its input")

    monkeypatch.setattr(bench.commands.fetch_command, "fetch", fail)
    monkeypatch.setattr(hybridmodel.train, "train", fail)
    monkeypatch.setattr(hybridmodel.hybrid_delta, "ship_artifacts", fail)
    monkeypatch.setattr(hybridmodel.hybrid_delta, "rebuild", fail)

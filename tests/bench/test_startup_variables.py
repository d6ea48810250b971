"""Variables of the environment that a run reads are checked as a command that loads a model starts: a bad value is
one line and exit 2 before any work, not a traceback from inside the run."""

import pytest

import bench.run.compare
from bench.commands.cli import main
from runtime.errors import UsageError
from runtime.fused_kernels import KERNELS_VARIABLE, kernel_choice


@pytest.mark.parametrize("value", ["Torch", "", "fused"])
def test_a_mistyped_kernels_variable_is_one_line_before_any_work(tmp_path, monkeypatch, capsys, value):
    """Probe 14: ``HYBRIDPRESS_KERNELS=Torch`` loaded the model, started the run and ended in a ValueError traceback
    from inside the first prefill."""
    def no_work(settings):
        raise AssertionError("the run was planned: the variable was not checked first")

    monkeypatch.setenv(KERNELS_VARIABLE, value)
    monkeypatch.setattr(bench.run.compare, "plan", no_work)
    out = tmp_path / "out"
    assert main(["compare", "--tasks", "niah_single_1", "--n", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"bench compare: error: {KERNELS_VARIABLE}={value!r}: expected auto or torch (auto: the fused kernels on CUDA "
        "where installed; torch: the pure-torch kernels everywhere), or leave it unset"]
    assert not out.exists()


@pytest.mark.parametrize("value", ["auto", "torch", None])
def test_the_kernels_variable_takes_auto_and_torch(monkeypatch, value):
    if value is None:
        monkeypatch.delenv(KERNELS_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(KERNELS_VARIABLE, value)
    assert kernel_choice() == (value or "auto")


def test_the_kernels_variable_is_read_by_one_parser(monkeypatch):
    """The layers ask :func:`kernel_choice` too: a library user (no command to check it first) gets the same
    UsageError at the first prefill."""
    import torch

    from runtime.fused_kernels import uses_fla

    monkeypatch.setenv(KERNELS_VARIABLE, "Torch")
    with pytest.raises(UsageError, match="HYBRIDPRESS_KERNELS='Torch': expected auto or torch"):
        uses_fla(torch.zeros(2))

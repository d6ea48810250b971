"""A comparison's settings, checked before work: the engine and what it runs, press and allocator options typed by
their fields and named in the rows, ``--jobs`` capped at the contexts and warned above the cores, a download
asked for while the hub is offline."""


import pytest

import allocators
import presses
from bench.run import compare
from bench.run.compare import CompareSettings, run_compare
from pretrained import loading
from tests.helpers import compare_settings


def test_engine_settings_are_checked_before_work(tmp_path):
    with pytest.raises(ValueError, match="unknown engine 'tgi'; choose from hf, vllm"):
        compare.plan(CompareSettings(presses=["keydiff"], engine="tgi", out=tmp_path))
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ValueError, match="--engine vllm needs vLLM, which lives in its own environment"):
            compare.plan(CompareSettings(presses=["keydiff"], engine="vllm", out=tmp_path))
    else:
        for settings, message in [
            (dict(presses=["kvpress:KnormPress"]), "kvpress presses do not run in the engine"),
            (dict(presses=["keydiff"], allocators=["adakv"]), "allocator 'adakv' does not run in the engine"),
            (dict(presses=["keydiff"], jobs=2), "the vLLM engine runs in one process"),
        ]:
            with pytest.raises(ValueError, match=message):
                compare.plan(CompareSettings(**settings, engine="vllm", out=tmp_path))


def test_options_are_typed_by_their_fields():
    assert presses.get("keydiff", normalized_anchor="no").normalized_anchor is False
    assert presses.get("keydiff", normalized_anchor="YES").normalized_anchor is True
    assert presses.get("snapkv", window="8").window == 8
    with pytest.raises(ValueError, match=r"keydiff option normalized_anchor='maybe': expected true or false \(also "
                                         r"yes/no, 1/0\)"):
        presses.get("keydiff", normalized_anchor="maybe")
    with pytest.raises(ValueError, match="snapkv option window='8.5': expected an integer"):
        presses.get("snapkv", window="8.5")
    with pytest.raises(ValueError, match="adakv option safeguard='abc': expected a number"):
        allocators.get("adakv", safeguard="abc")
    with pytest.raises(ValueError, match=r"perlayer option weights='abc': expected numbers separated by '/'"):
        allocators.get("perlayer", weights="abc")
    assert allocators.get("perlayer", weights="5").weights == [1.0]  # held divided by the smallest weight
    assert allocators.get("perlayer", weights="2/4").weights == [1.0, 2.0]
    assert presses.get("kvpress:SnapKVPress", window_size="16").press.window_size == 16


def test_typed_options_name_the_rows(model_dir, tmp_path):
    settings = compare_settings(model_dir, tmp_path, press_options={"normalized_anchor": "yes"},
                                allocators=["perlayer"], alloc_options={"weights": "1/3"})
    run = compare.plan(settings)
    [method] = run.methods
    assert method.press.label == "keydiff(normalized_anchor=True)"
    assert method.allocator.label == "perlayer(weights=1;3)" and method.allocator.kwargs == {"weights": [1.0, 3.0]}
    assert method.label == "keydiff(normalized_anchor=True)/perlayer(weights=1;3)"
    # the settings planned are not changed: their options stay as given
    assert settings.press_options == {"normalized_anchor": "yes"} and settings.alloc_options == {"weights": "1/3"}


def test_jobs_are_capped_at_the_contexts_and_warned_above_the_cores(model_dir, tmp_path, capsys, monkeypatch):
    import os

    import bench.run.compare
    from bench.run.execution import ContextWorker

    pools = []

    def in_this_process(run, identity, jobs, workers):  # the workers' protocol, here: no model-loading processes
        pools.append(workers)
        worker = ContextWorker(run, identity)
        return (worker.rows(job) for job in jobs)  # a generator, as in_processes returns

    monkeypatch.setattr(bench.run.compare, "in_processes", in_this_process)
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    capsys.readouterr()
    run_compare(compare_settings(model_dir, tmp_path / "one", jobs=64), show_progress=False)
    err = capsys.readouterr().err
    assert "--jobs 64 capped at 1: the run has 1 context(s)" in err and not pools
    run_compare(compare_settings(model_dir, tmp_path / "two", n=2, jobs=64), show_progress=False)
    err = capsys.readouterr().err
    assert "capped at 2" in err and "warning: 2 worker processes on 1 CPU core(s)" in err
    assert pools == [2]


def test_allow_download_when_the_hub_is_offline(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError, match="the hub is offline because HF_HUB_OFFLINE is set") as error:
        loading.resolve(loading.ModelSpec("nobody/no-such-model", allow_download=True))
    assert "pass --allow-download" not in str(error.value)

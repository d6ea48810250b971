"""A result's identity: the weights, config, tokenizer and chat template, the artifacts, dtype and device each
name the model a row was answered by, so that a store never passes off one model's results as another's."""

import json

import pytest

from bench.run.compare import run_compare, run_rows
from pretrained import loading
from runtime.errors import UsageError
from tests.helpers import compare_settings, copy_model


def test_identity_names_each_part_of_the_model(model_dir, tmp_path):
    base = loading.identity(model_dir)
    copy = copy_model(model_dir, tmp_path)
    assert loading.identity(copy) == base
    config = json.loads((copy / "config.json").read_text())
    config["rope_parameters"]["rope_theta"] = 10.0
    (copy / "config.json").write_text(json.dumps(config))
    changed = loading.identity(copy)
    assert changed.parts["config"] != base.parts["config"] and changed.weights != base.weights
    assert {k: v for k, v in changed.parts.items() if k != "config"} == {k: v for k, v in base.parts.items()
                                                                         if k != "config"}
    (copy / "chat_template.jinja").write_text("{{ messages }}")
    assert loading.identity(copy).parts["tokenizer"] != base.parts["tokenizer"]
    import shutil

    shutil.rmtree(copy / "gatesight")
    assert loading.identity(copy).artifacts != base.artifacts
    assert loading.fingerprint(model_dir) == base.weights


def test_a_reconfigured_model_is_refused_naming_what_differs(model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    run_compare(compare_settings(model_dir, out, presses=["none"]), show_progress=False)
    before = (out / "results.jsonl").read_bytes()
    copy = copy_model(model_dir, tmp_path)
    config = json.loads((copy / "config.json").read_text())
    config["rope_parameters"]["rope_theta"] = 10.0
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"holds results of model .* with other config \(fingerprint"):
        run_compare(compare_settings(copy, out, presses=["none"]), show_progress=False)
    assert (out / "results.jsonl").read_bytes() == before


def test_a_copy_without_gatesight_is_kept_apart_not_refused(model_dir, tmp_path, capsys):
    import shutil

    out = tmp_path / "out"
    first = run_compare(compare_settings(model_dir, out, presses=["none"]), show_progress=False)
    copy = copy_model(model_dir, tmp_path)
    shutil.rmtree(copy / "gatesight")
    capsys.readouterr()
    store = run_compare(compare_settings(copy, out, presses=["none"]), show_progress=False)
    err = capsys.readouterr().err
    assert "with other artifacts" in err and "other weights" not in err
    assert len(store.rows) == 2 * len(first.rows)
    assert len({r["artifacts"] for r in store.rows}) == 2 and len({r["weights"] for r in store.rows}) == 1
    own = run_rows(store, compare_settings(copy, out, presses=["none"]))
    assert len(own) == len(first.rows) and {r["artifacts"] for r in own} == {loading.identity(copy).artifacts}


@pytest.mark.slow  # ~3 s: two runs; CI's slow run holds it
def test_dtype_and_device_are_part_of_a_results_identity(model_dir, tmp_path):
    out = tmp_path / "out"
    first = run_compare(compare_settings(model_dir, out, presses=["none"]), show_progress=False)
    assert {(r["dtype"], r["device"]) for r in first.rows} == {("float32", "cpu")}
    bf16 = compare_settings(model_dir, out, presses=["none"], model=loading.ModelSpec(str(model_dir), dtype="bfloat16"))
    store = run_compare(bf16, show_progress=False)
    assert len(store.rows) == 2 * len(first.rows)  # the bfloat16 run answered, it did not reuse the float32 rows
    own = run_rows(store, bf16)
    assert len(own) == len(first.rows) and {r["dtype"] for r in own} == {"bfloat16"}
    from bench.reports.report import group_rows, group_title

    titles = [group_title(key) for key in group_rows(store.rows)]
    assert len(titles) == 2 and sum("dtype bfloat16" in t for t in titles) == 1


def test_a_source_edited_during_a_run_changes_neither_its_rows_version_nor_its_summary(model_dir, tmp_path,
                                                                                     monkeypatch):
    """The code version is fixed when the run is planned: a long run whose sources are edited meanwhile
    (a session committing beside a sweep) still finds the rows it wrote (the sharded sweep's summary found none)."""
    import bench.run.plan
    from bench.run.compare import plan
    from bench.store.code_version import code_version

    checked = plan(compare_settings(model_dir, tmp_path / "out"))
    assert checked.code == code_version("hf") and plan(checked).code == checked.code
    edited = lambda engine="hf": "edited-meanwhile"  # noqa: E731 - what code_version says once a module changed
    monkeypatch.setattr(bench.run.plan, "code_version", edited)
    store = run_compare(checked, show_progress=False)
    assert {r["code"] for r in store.rows} == {checked.code}
    assert len(run_rows(store, checked)) == len(store.rows) > 0
    assert plan(compare_settings(model_dir, tmp_path / "out")).code == "edited-meanwhile"


def test_a_model_directory_written_during_a_run_keeps_the_run_whole(model_dir, tmp_path, capsys, monkeypatch):
    """bench calibrate writing into the model directory while bench compare runs: the model is fingerprinted once,
    when the run begins; its rows name that identity and the summary reads every one of them."""
    import bench.run.compare
    from bench.store.result_store import ResultStore
    from tests.helpers import run_cli

    copy = copy_model(model_dir, tmp_path)
    before = loading.identity(copy)
    original = bench.run.compare.execute

    def run_then_recalibrate(run, *args, **kwargs):
        outcome = original(run, *args, **kwargs)
        (copy / "calibration" / "calibration.safetensors").write_bytes(b"written meanwhile")
        return outcome

    monkeypatch.setattr(bench.run.compare, "execute", run_then_recalibrate)
    out = tmp_path / "out"
    code, err = run_cli(capsys, "compare", "--model", copy, "--press", "none", "--tasks", "niah_single_1", "--n", 1,
                        "--length", 300, "--out", out)
    assert code == 0, err
    assert loading.identity(copy).artifacts != before.artifacts
    rows = ResultStore(out, readonly=True).rows
    assert len(rows) == 1 and rows[0]["artifacts"] == before.artifacts
    assert "Items per task: niah_single_1 1." in (out / "summary.md").read_text()


def test_a_worker_that_loads_another_model_than_the_runs_refuses(model_dir, tmp_path):
    """With --jobs the driver fingerprints the model and loads none; each worker loads it once and refuses to
    answer if what it loaded is not what the run's rows name (the directory written in between)."""
    from bench.run.compare import plan
    from bench.run.execution import ContextWorker

    copy = copy_model(model_dir, tmp_path)
    run, identity = plan(compare_settings(copy, tmp_path / "out")), loading.identity(copy)
    assert ContextWorker(run, identity).harness.identity == identity
    (copy / "config.json").write_text((copy / "config.json").read_text() + "\n")
    with pytest.raises(UsageError, match=f"{copy} changed since the run began"):
        ContextWorker(run, identity)

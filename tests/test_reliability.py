"""A hostile but fair user: mixed settings, concurrent writers, broken stores, bad input (CLI and library)."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import allocators
import bench.store as store_module
import presses
from allocators import BudgetRequest
from bench import compare, loading
from bench.cli import main
from bench.compare import CompareSettings, run_compare, run_rows
from bench.store import ResultStore, _normalised_source, code_version, result_modules
from presses.selection import plan_for
from runtime import EvidenceRequest, KeepPlan, prefill


def _settings(model_dir, out, **kw):
    base = dict(presses=["keydiff", "none"], allocators=["flat"], keep_fractions=[0.5], tasks=["niah_single_1"], n=1,
                length=300, model=str(model_dir), out=out)
    return CompareSettings(**{**base, **kw})


@pytest.fixture
def no_model_load(monkeypatch):
    """Any attempt to load a model fails the test: the error must come before."""
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad input was reported")
    monkeypatch.setattr(loading, "load", refuse)


# ---- 1. results never mix ---------------------------------------------------------------------------------------
def test_code_version_ignores_comments_and_docstrings(tmp_path):
    a, b, c = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    a.write_text('def f(x):\n    return x + 1\n')
    b.write_text('"""Module doc."""\n\n\ndef f(x):  # a comment\n    """Doc."""\n    # why\n    return x + 1\n')
    c.write_text('def f(x):\n    return x + 2\n')
    assert _normalised_source(a) == _normalised_source(b) != _normalised_source(c)
    hf = result_modules("hf")
    assert not any(m in hf for m in ("bench.report", "bench.cli", "bench.store", "bench.leaderboard"))
    assert {"runtime.session", "presses.keydiff", "allocators.flat", "bench.rows"} <= set(hf)
    assert not any(m.startswith("serving") for m in hf) and "serving.worker" in result_modules("vllm")


def test_code_version_follows_what_each_engines_rows_import(tmp_path, monkeypatch):
    """A serving-only edit keeps the hf engine's code version (and changes vLLM's); a runtime edit changes both."""
    for package in ("runtime", "presses", "allocators", "bench", "serving", "pretrained"):
        for path in (store_module.ROOT / package).rglob("*.py"):
            target = tmp_path / path.relative_to(store_module.ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(path.read_text())
    monkeypatch.setattr(store_module, "ROOT", tmp_path)
    hf, vllm = code_version("hf"), code_version("vllm")
    assert hf != vllm
    with (tmp_path / "serving" / "worker.py").open("a") as f:
        f.write("\nSERVING_ONLY_CHANGE = 1\n")
    assert code_version("hf") == hf and code_version("vllm") != vllm
    vllm = code_version("vllm")
    with (tmp_path / "runtime" / "kv.py").open("a") as f:
        f.write("\nRUNTIME_CHANGE = 1\n")
    assert code_version("hf") != hf and code_version("vllm") != vllm


def test_a_run_summarises_only_its_own_settings(model_dir, tmp_path):
    first = run_compare(_settings(model_dir, tmp_path), show_progress=False)
    run_compare(_settings(model_dir, tmp_path, length=400), show_progress=False)
    store = ResultStore(tmp_path, readonly=True)
    assert {r["length"] for r in store.rows} == {300, 400}
    own = run_rows(store, _settings(model_dir, tmp_path))
    assert {r["length"] for r in own} == {300} and len(own) == len(first.rows)


# ---- 2. one writer at a time -------------------------------------------------------------------------------------
def test_a_second_writer_is_refused_at_once(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from bench.store import ResultStore
        store = ResultStore({str(tmp_path)!r})
        print("locked", flush=True)
        time.sleep(30)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match=f"being written by another process \\(pid {holder.pid}\\)"):
            ResultStore(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    ResultStore(tmp_path).close()  # the lock died with its process


# ---- 3. lines that are not rows -----------------------------------------------------------------------------------
def test_lines_that_are_not_rows_are_skipped_and_counted(model_dir, tmp_path, capsys):
    run_compare(_settings(model_dir, tmp_path), show_progress=False)
    path = tmp_path / "results.jsonl"
    good = path.read_bytes()
    path.write_bytes(good + b"42\n{}\n\xff\xfe not utf-8\n" + b'{"press": "none"}\n')
    damaged = path.read_bytes()
    capsys.readouterr()
    store = run_compare(_settings(model_dir, tmp_path), show_progress=False)  # resumes: nothing to do
    err = capsys.readouterr().err
    rows = good.count(b"\n")
    assert f"skipped 4 line(s) that are not result rows (line {rows + 1}, {rows + 2}, {rows + 3}, {rows + 4})" in err
    assert str(path) in err and store.skipped == [rows + 1, rows + 2, rows + 3, rows + 4]
    assert path.read_bytes() == damaged  # nothing rewritten
    from bench.leaderboard import write_leaderboard

    assert write_leaderboard([tmp_path], tmp_path / "docs").exists()


def test_a_store_from_before_the_fidelity_metrics_is_refused(model_dir, tmp_path):
    old = {"model": "m", "press": "none", "allocator": "none", "ratio": 1.0, "task": "vt", "item": 0, "score": 1.0}
    (tmp_path / "results.jsonl").write_text(json.dumps(old) + "\n")
    before = (tmp_path / "results.jsonl").read_bytes()
    with pytest.raises(ValueError, match="1 row\\(s\\) written before the fidelity metrics"):
        run_compare(_settings(model_dir, tmp_path), show_progress=False)
    assert (tmp_path / "results.jsonl").read_bytes() == before


def test_rows_stored_under_the_old_name_ratio_are_read_as_keep_fraction():
    import gzip

    directory = Path(__file__).resolve().parent.parent / "docs" / "realtext" / "before"  # written before the rename
    raw = [json.loads(line) for line in gzip.decompress((directory / "results.jsonl.gz").read_bytes()).splitlines()]
    assert raw and all("ratio" in r and "keep_fraction" not in r for r in raw)
    rows = ResultStore(directory, readonly=True).rows
    assert [r["keep_fraction"] for r in rows] == [r["ratio"] for r in raw]
    assert not any("ratio" in r for r in rows)


# ---- 4. CLI errors before work ------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--ratios", ""], "--keep-fractions is empty"),
    (["--press", ""], "--press is empty"),
    (["--alloc", ""], "--alloc is empty"),
    (["--tasks", ""], "--tasks is empty"),
    (["--press", "kvpress"], "name the kvpress scorer to wrap: kvpress:<ClassName>"),
    (["--press", "kvpress:NoSuchPress"], "'NoSuchPress' is not a kvpress ScorerPress; available: .*KnormPress"),
    (["--length", "10000000"], "length 10000000 is longer than the model's position limit"),
    (["--ratios", "0.5,1.5"], r"keep fraction 1.5 is outside \(0, 1\]"),
])
def test_cli_errors_come_before_the_model_loads(model_dir, tmp_path, capsys, no_model_load, argv, message):
    code = main(["compare", "--model", str(model_dir), "--out", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("bench compare: error: ") and err.count("\n") == 1
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "out" / "results.jsonl").exists()


def test_out_that_is_a_file_is_refused_before_work(model_dir, tmp_path, no_model_load):
    (tmp_path / "file").write_text("x")
    for out in (tmp_path / "file", tmp_path / "file" / "below"):
        with pytest.raises(ValueError, match="is a file, not a directory"):
            run_compare(_settings(model_dir, out), show_progress=False)


def test_cost_refuses_bad_lengths_before_work(model_dir, tmp_path, capsys, no_model_load):
    assert main(["cost", "--model", str(model_dir), "--lengths", "0", "--out", str(tmp_path)]) == 2
    assert "length 0 is not allowed" in capsys.readouterr().err


# ---- 6. Ctrl-C ----------------------------------------------------------------------------------------------------
def test_ctrl_c_says_how_to_resume(model_dir, tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(compare, "run_compare", interrupted)
    assert main(["compare", "--model", str(model_dir), "--out", str(tmp_path)]) == 130
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "interrupted" in err and "resume" in err and str(tmp_path) in err


# ---- 5. library inputs --------------------------------------------------------------------------------------------
def _parent(tiny, n=60, protected=4, evidence=EvidenceRequest()):
    torch.manual_seed(0)
    return prefill(tiny("qwen3_5"), torch.randint(0, 97, (n,)), protected=protected, evidence=evidence)


def test_plan_for_refuses_bad_scores(tiny):
    parent = _parent(tiny)
    flat = allocators.get("flat")
    scores = {layer: torch.rand(2, parent.n - parent.protected) for layer in parent.adapter.attention_layers}
    first = parent.adapter.attention_layers[0]
    with pytest.raises(ValueError, match=f"scores of layer {first} contain NaN"):
        plan_for(parent,
                 {**scores, first: scores[first].masked_fill(torch.rand_like(scores[first]) < 0.1, float("nan"))},
                 flat, 0.5)
    with pytest.raises(ValueError, match=r"shape \(2, 20\); expected \[H_kv, n_body\] = \[2, 56\]"):
        plan_for(parent, {**scores, first: torch.rand(2, 20)}, flat, 0.5)
    assert plan_for(parent, scores, flat, 0.5).total() == 2 * 2 * 28


def test_snapkv_inputs(tiny):
    with pytest.raises(ValueError, match="window=-5"):
        presses.get("snapkv", window=-5)
    with pytest.raises(ValueError, match="kernel=8: expected an odd integer"):
        presses.get("snapkv", kernel=8)
    press = presses.get("snapkv")
    with pytest.raises(ValueError, match="prefill with evidence=press.evidence"):
        press.score(_parent(tiny))
    short = _parent(tiny, n=20, evidence=press.evidence(None))  # shorter than the 32-token window
    scores = press.score(short)
    assert all(s.shape == (2, 16) for s in scores.values())
    assert presses.compress(short, press, "flat", keep_fraction=0.5).kv_nbytes > 0


def test_token_ids_and_protected_are_checked(tiny):
    model = tiny("qwen3_5")
    with pytest.raises(ValueError,
                       match=r"context_ids\[2\] = 97 is not a token id of this model: ids must be in \[0, 97\)"):
        prefill(model, torch.tensor([1, 2, 97, 3]))
    with pytest.raises(ValueError, match=r"context_ids\[0\] = -1"):
        prefill(model, torch.tensor([-1, 2, 3]))
    with pytest.raises(ValueError, match="protected=8.5 must be an integer"):
        prefill(model, torch.arange(20), protected=8.5)
    parent = prefill(model, torch.arange(20))
    with pytest.raises(ValueError, match=r"question_ids\[1\] = 500"):
        parent.answer(torch.tensor([1, 500]), 2)


def test_plan_positions_may_be_any_integer_sequence(tiny):
    parent = _parent(tiny, n=30)
    as_lists = KeepPlan({layer: [[4, 7, 9], list(range(10, 20))] for layer in parent.adapter.attention_layers})
    as_tensors = KeepPlan({layer: [torch.tensor([4, 7, 9]), torch.arange(10, 20)]
                           for layer in parent.adapter.attention_layers})
    question = torch.tensor([5, 6])
    assert torch.equal(parent.fork(as_lists).logits(question), parent.fork(as_tensors).logits(question))
    with pytest.raises(ValueError, match="positions must be integers, got torch.float32"):
        KeepPlan({3: [[4.0, 5.5]]})


def test_gate_allocator_refuses_non_finite_weights():
    request = BudgetRequest(0.5, 100, (3, 7), 2, layer_weights={3: float("nan"), 7: 1.0})
    with pytest.raises(ValueError, match="must be finite, non-negative"):
        allocators.get("gate").allocate(request)


def test_press_and_allocator_options_from_the_cli(model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["compare", "--model", str(model_dir), "--out", str(out), "--press", "snapkv", "--press-options",
                 "window=8,kernel=3", "--alloc", "perlayer", "--alloc-options", "weights=1/3", "--ratios", "0.5",
                 "--tasks", "niah_single_1", "--n", "1", "--length", "300"]) == 0
    rows = ResultStore(out, readonly=True).rows
    assert {r["press"] for r in rows} == {"none", "snapkv(kernel=3,window=8)"}
    assert {r["allocator"] for r in rows} == {"none", "perlayer(weights=1;3)"}
    capsys.readouterr()
    assert main(["compare", "--model", str(model_dir), "--out", str(out), "--press", "snapkv",
                 "--press-options", "windw=8"]) == 2
    assert "snapkv has no option 'windw'; valid: window, kernel, gqa" in capsys.readouterr().err
    assert main(["compare", "--model", str(model_dir), "--out", str(out), "--press", "snapkv",
                 "--press-options", "window=-1"]) == 2
    assert "window=-1: expected an integer >= 1" in capsys.readouterr().err


def test_engine_settings_are_checked_before_work(tmp_path):
    with pytest.raises(ValueError, match="unknown engine 'tgi'; choose from hf, vllm"):
        compare.validate(CompareSettings(presses=["keydiff"], engine="tgi", out=tmp_path))
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ValueError, match="--engine vllm needs vLLM, which lives in its own environment"):
            compare.validate(CompareSettings(presses=["keydiff"], engine="vllm", out=tmp_path))
    else:
        for settings, message in [
            (dict(presses=["kvpress:KnormPress"]), "kvpress presses do not run in the engine"),
            (dict(presses=["keydiff"], allocators=["adakv"]), "allocator 'adakv' does not run in the engine"),
            (dict(presses=["keydiff"], jobs=2), "the vLLM engine runs in one process"),
        ]:
            with pytest.raises(ValueError, match=message):
                compare.validate(CompareSettings(**settings, engine="vllm", out=tmp_path))


def test_rows_from_before_the_engine_field_read_as_the_runtimes(tmp_path):
    row = {"schema": 2, "model": "m", "weights": "w", "press": "none", "allocator": "none", "keep_fraction": 1.0,
           "task": "vt", "profile": "compact", "length": 512, "item": 0, "question": 0, "seed": 0, "code": "c"}
    (tmp_path / "results.jsonl").write_text(json.dumps(row) + "\n")
    (stored,) = ResultStore(tmp_path, readonly=True).rows
    assert stored["engine"] == "hf"


# ---- issue 19: nothing a user types destroys a model or passes off one run's results as another's --------------
def _cli(capsys, *argv) -> tuple[int, str]:
    """Exit code and stderr of ``bench argv``; an error must be one line, the last, ``bench <cmd>: error: ...``
    (a progress bar may come before it)."""
    capsys.readouterr()
    code = main(list(map(str, argv)))
    err = capsys.readouterr().err
    if code == 2:
        last = err.splitlines()[-1]
        assert last.startswith(f"bench {argv[0]}: error: ") and err.count(": error: ") == 1, err
        return code, last
    return code, err


def _copy(model_dir, tmp_path):
    """A copy of the tiny model under the same directory name."""
    import shutil

    copy = tmp_path / "copy" / model_dir.name
    shutil.copytree(model_dir, copy)
    return copy


# 1. data lost
def test_train_model_never_writes_over_a_trained_model(tmp_path, capsys, monkeypatch):
    from hybridmodel import train as training

    monkeypatch.setattr(training, "train", lambda *a, **k: pytest.fail("training started"))
    out, checkpoints = tmp_path / "model", tmp_path / "checkpoints"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"trained")
    for steps in ("0", "-3"):
        code, err = _cli(capsys, "train-model", "--steps", steps, "--out", tmp_path / "fresh",
                         "--checkpoints", checkpoints)
        assert code == 2 and f"--steps {steps}: give a positive number of training steps" in err
    code, err = _cli(capsys, "train-model", "--steps", 5, "--out", out, "--checkpoints", checkpoints)
    assert code == 2 and f"{out} holds a trained model (model.safetensors); pass --resume" in err and "--replace" in err
    code, err = _cli(capsys, "train-model", "--resume", "--out", out, "--checkpoints", checkpoints)
    assert code == 2 and f"--resume: no checkpoint at {checkpoints / 'last.pt'}" in err
    assert (out / "model.safetensors").read_bytes() == b"trained"
    with pytest.raises(ValueError, match="steps=0: expected an integer >= 1"):
        training.TrainConfig(steps=0)


def test_a_replaced_model_moves_aside_with_its_artifacts(tiny, tmp_path):
    from hybridmodel.tokenizer import build_tokenizer
    from hybridmodel.train import save

    out = tmp_path / "model"
    (out / "gatesight").mkdir(parents=True)
    (out / "model.safetensors").write_bytes(b"old weights")
    (out / "gatesight" / "gatesight.safetensors").write_bytes(b"old estimator")
    (out / "calibration").mkdir()
    lines = []
    save(tiny("qwen3"), build_tokenizer(), out, {"steps_done": 1}, log=lines.append)
    (backup,) = tmp_path.glob("model.backup-*")
    assert (backup / "model.safetensors").read_bytes() == b"old weights"
    assert (backup / "gatesight" / "gatesight.safetensors").exists() and (backup / "calibration").is_dir()
    assert not (out / "gatesight").exists() and not (out / "calibration").exists()
    assert (out / "model.safetensors").stat().st_size > 1000 and str(backup) in lines[0]


# 2 + 3. a result's identity: weights, config, tokenizer, chat template, artifacts, dtype, device
def test_identity_names_each_part_of_the_model(model_dir, tmp_path):
    base = loading.identity(model_dir)
    copy = _copy(model_dir, tmp_path)
    assert loading.identity(copy) == base
    config = json.loads((copy / "config.json").read_text())
    config["rope_parameters"]["rope_theta"] = 10.0
    (copy / "config.json").write_text(json.dumps(config))
    changed = loading.identity(copy)
    assert changed.parts["config"] != base.parts["config"] and changed.model != base.model
    assert {k: v for k, v in changed.parts.items() if k != "config"} == {k: v for k, v in base.parts.items()
                                                                         if k != "config"}
    (copy / "chat_template.jinja").write_text("{{ messages }}")
    assert loading.identity(copy).parts["tokenizer"] != base.parts["tokenizer"]
    import shutil

    shutil.rmtree(copy / "gatesight")
    assert loading.identity(copy).artifacts != base.artifacts
    assert loading.fingerprint(model_dir) == base.model


def test_a_reconfigured_model_is_refused_naming_what_differs(model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    run_compare(_settings(model_dir, out, presses=["none"]), show_progress=False)
    before = (out / "results.jsonl").read_bytes()
    copy = _copy(model_dir, tmp_path)
    config = json.loads((copy / "config.json").read_text())
    config["rope_parameters"]["rope_theta"] = 10.0
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"holds results of model .* with other config \(fingerprint"):
        run_compare(_settings(copy, out, presses=["none"]), show_progress=False)
    assert (out / "results.jsonl").read_bytes() == before


def test_a_copy_without_gatesight_is_kept_apart_not_refused(model_dir, tmp_path, capsys):
    import shutil

    out = tmp_path / "out"
    first = run_compare(_settings(model_dir, out, presses=["none"]), show_progress=False)
    copy = _copy(model_dir, tmp_path)
    shutil.rmtree(copy / "gatesight")
    capsys.readouterr()
    store = run_compare(_settings(copy, out, presses=["none"]), show_progress=False)
    err = capsys.readouterr().err
    assert "with other artifacts" in err and "other weights" not in err
    assert len(store.rows) == 2 * len(first.rows)
    assert len({r["artifacts"] for r in store.rows}) == 2 and len({r["weights"] for r in store.rows}) == 1
    own = run_rows(store, _settings(copy, out, presses=["none"]))
    assert len(own) == len(first.rows) and {r["artifacts"] for r in own} == {loading.identity(copy).artifacts}


def test_dtype_and_device_are_part_of_a_results_identity(model_dir, tmp_path):
    out = tmp_path / "out"
    first = run_compare(_settings(model_dir, out, presses=["none"]), show_progress=False)
    assert {(r["dtype"], r["device"]) for r in first.rows} == {("float32", "cpu")}
    bf16 = _settings(model_dir, out, presses=["none"], model=loading.ModelSpec(str(model_dir), dtype="bfloat16"))
    store = run_compare(bf16, show_progress=False)
    assert len(store.rows) == 2 * len(first.rows)  # the bfloat16 run answered, it did not reuse the float32 rows
    own = run_rows(store, bf16)
    assert len(own) == len(first.rows) and {r["dtype"] for r in own} == {"bfloat16"}
    from bench.report import group_rows, group_title

    titles = [group_title(key) for key in group_rows(store.rows)]
    assert len(titles) == 2 and sum("dtype bfloat16" in t for t in titles) == 1


def test_the_committed_store_still_reads_and_verifies():
    from bench.report import group_rows, group_title
    from bench.store import ROOT

    store = ResultStore(ROOT / "docs" / "results", readonly=True)
    assert store.rows and store.problems() == []
    assert {(r["dtype"], r["device"], r["engine"]) for r in store.rows} == {("float32", "cpu", "hf")}
    titles = [group_title(key) for key in group_rows(store.rows)]
    published = (ROOT / "docs" / "leaderboard.md").read_text()
    assert {r["length"] for r in store.rows} == {2048, 4096} and len(titles) == 2
    assert all("dtype" not in title and title in published for title in titles)


# 4. bench verify checks types, finiteness and ranges, naming file and line
GOOD_ROW = {"schema": 2, "model": "m", "weights": "w", "artifacts": "a", "press": "none", "allocator": "none",
            "keep_fraction": 1.0, "task": "vt", "profile": "compact", "length": 512, "item": 0, "question": 0,
            "seed": 0, "code": "c", "engine": "hf", "dtype": "float32", "device": "cpu", "score": 1.0,
            "answer_nll": 0.5, "delta_nll": 0.0, "kl": 0.0, "agree": True}


@pytest.mark.parametrize("change, message", [
    ({"kl": -1.0}, "kl=-1.0 (expected a finite number >= 0)"),
    ({"score": float("nan")}, "score=nan (expected a number in [0, 1])"),
    ({"score": 1.5}, "score=1.5 (expected a number in [0, 1])"),
    ({"delta_nll": "abc"}, "delta_nll='abc' (expected a finite number)"),
    ({"agree": "yes"}, "agree='yes' (expected true or false)"),
    ({"kl": float("inf")}, "kl=inf"),
])
def test_verify_and_the_leaderboard_refuse_impossible_rows(tmp_path, capsys, change, message):
    compacted = {**GOOD_ROW, "press": "keydiff", "allocator": "flat", "keep_fraction": 0.5, "delta_nll": 0.3, "kl": 0.1,
                 "agree": False}
    lines = [GOOD_ROW, compacted, {**compacted, "item": 1, **change}]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in lines))
    for argv in (["verify", tmp_path], ["leaderboard", tmp_path, "--out", tmp_path / "docs"]):
        code, err = _cli(capsys, *argv)
        assert code == 2 and "1 row(s) are not valid results" in err, err
        assert f"{tmp_path / 'results.jsonl'}:3: {message}" in err
    assert not (tmp_path / "docs" / "leaderboard.md").exists()


def test_verify_refuses_a_no_prune_row_that_changed(tmp_path, capsys):
    (tmp_path / "results.jsonl").write_text(json.dumps({**GOOD_ROW, "delta_nll": 0.2}) + "\n")
    code, err = _cli(capsys, "verify", tmp_path)
    assert code == 2 and f"{tmp_path / 'results.jsonl'}:1: the no-prune row has delta_nll=0.2" in err


# 5. options typed by their fields
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
    assert allocators.get("perlayer", weights="5").weights == [5.0]
    assert allocators.get("perlayer", weights="1/2").weights == [1.0, 2.0]
    assert presses.get("kvpress:SnapKVPress", window_size="16").press.window_size == 16


def test_typed_options_name_the_rows(model_dir, tmp_path):
    settings = _settings(model_dir, tmp_path, press_options={"normalized_anchor": "no"},
                         allocators=["perlayer"], alloc_options={"weights": "1/3"})
    checked = compare.validate(settings)
    assert checked.press_label("keydiff") == "keydiff(normalized_anchor=False)"
    assert checked.alloc_label("perlayer") == "perlayer(weights=1;3)"
    # the settings checked are not changed: their options stay as given
    assert settings.press_options == {"normalized_anchor": "no"} and settings.alloc_options == {"weights": "1/3"}
    assert settings.press_label("keydiff") == "keydiff(normalized_anchor=no)"


@pytest.mark.parametrize("argv, message", [
    (["--alloc", "perlayer", "--alloc-options", "weights=5"],
     "perlayer has 1 weights; the model has 2 attention layers"),
    (["--alloc", "adakv", "--alloc-options", "safeguard=abc"], "adakv option safeguard='abc': expected a number"),
    (["--alloc", "perlayer", "--alloc-options", "weights=abc"], "perlayer option weights='abc'"),
    (["--press", "keydiff", "--press-options", "normalized_anchor=maybe"], "expected true or false"),
    (["--press", "kvpress:ScorerPress"], "kvpress:ScorerPress is the abstract base of kvpress's scorers"),
])
def test_bad_options_are_refused_before_the_model_loads(model_dir, tmp_path, capsys, no_model_load, argv, message):
    code, err = _cli(capsys, "compare", "--model", model_dir, "--out", tmp_path / "out", *argv)
    assert code == 2 and message in err, err
    assert not (tmp_path / "out" / "results.jsonl").exists()


# 6. damaged files: one error naming the file
def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("damage, message", [
    (lambda d: _truncate(d / "model.safetensors"), "model.safetensors: not a complete safetensors file"),
    (lambda d: _truncate(d / "gatesight" / "gatesight.safetensors"),
     "gatesight.safetensors: not a complete safetensors file"),
    (lambda d: _truncate(d / "calibration" / "calibration.safetensors"),
     "calibration.safetensors: not a complete safetensors file"),
    (lambda d: [p.unlink() for p in d.glob("tokenizer*")], "no tokenizer files"),
    (lambda d: (d / "config.json").write_text("{not json"), "config.json: not valid JSON"),
])
def test_a_damaged_model_directory_is_named(model_dir, tmp_path, capsys, damage, message):
    copy = _copy(model_dir, tmp_path)
    damage(copy)
    code, err = _cli(capsys, "compare", "--model", copy, "--out", tmp_path / "out", "--press", "gatesight",
                     "--ratios", "0.5", "--tasks", "niah_single_1", "--n", "1", "--length", "300")
    assert code == 2 and str(copy) in err and message in err, err


@pytest.mark.parametrize("make, message", [
    (lambda d: (d / "results.jsonl.gz").write_bytes(b"not gzip at all"), "results.jsonl.gz: not a complete gzip file"),
    (lambda d: (d / "results.jsonl.gz").write_bytes(__import__("gzip").compress(b'{"a": 1}\n' * 100)[:30]),
     "results.jsonl.gz: not a complete gzip file"),
    (lambda d: (d / "results.jsonl").mkdir(), "results.jsonl: is a directory, not a result store"),
])
def test_a_damaged_store_is_named(tmp_path, capsys, make, message):
    make(tmp_path)
    for argv in (["verify", tmp_path], ["leaderboard", tmp_path, "--out", tmp_path / "docs"]):
        code, err = _cli(capsys, *argv)
        assert code == 2 and message in err, err


# 7. outputs written atomically; a full or read-only disk is one clear error and a rerun resumes
def test_a_full_disk_is_one_error_and_a_rerun_resumes(model_dir, tmp_path, capsys, monkeypatch):
    import errno

    out = tmp_path / "out"
    argv = ["compare", "--model", model_dir, "--out", out, "--press", "keydiff", "--ratios", "0.5,0.2",
            "--tasks", "niah_single_1", "--n", "1", "--length", "300"]
    real_append = ResultStore.append

    def full_after_one(store, row):
        if len(store.rows) >= 1:
            raise OSError(errno.ENOSPC, "No space left on device", str(store.path))
        real_append(store, row)

    monkeypatch.setattr(ResultStore, "append", full_after_one)
    code, err = _cli(capsys, *argv)
    assert code == 2 and f"{out / 'results.jsonl'}: No space left on device" in err
    monkeypatch.setattr(ResultStore, "append", real_append)
    assert _cli(capsys, *argv)[0] == 0
    rows = ResultStore(out, readonly=True).rows
    assert len(rows) == 3 and len({json.dumps(r, sort_keys=True) for r in rows}) == 3
    summary = (out / "summary.md").read_text()
    assert summary.startswith("## ")
    real_write = Path.write_text

    def full_half_way(path, text, *args, **kwargs):  # the disk fills while the summary is written
        if "summary.md" not in path.name:
            return real_write(path, text, *args, **kwargs)
        real_write(path, text[:10])
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(Path, "write_text", full_half_way)
    code, err = _cli(capsys, *argv)
    monkeypatch.undo()
    assert code == 2 and "No space left on device" in err
    assert (out / "summary.md").read_text() == summary and sorted(p.name for p in out.iterdir()) == [
        ".lock", "curves.png", "results.jsonl", "summary.md"]


def test_a_read_only_leaderboard_out_is_one_error(tmp_path, capsys, monkeypatch):
    from bench import files

    (tmp_path / "results.jsonl").write_text(json.dumps(GOOD_ROW) + "\n")

    def read_only(*args, dir=None, **kwargs):
        raise PermissionError(13, "Permission denied", str(dir))

    monkeypatch.setattr(files.tempfile, "mkstemp", read_only)
    code, err = _cli(capsys, "leaderboard", tmp_path, "--out", tmp_path / "docs")
    assert code == 2 and f"{tmp_path / 'docs'}: Permission denied" in err


# 8. errors before work, and the right advice
def test_fractions_are_given_one_way_and_checked_as_typed(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--ratios", "0.5", "--compression-ratios", "0.9"])
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["compare", "--compression-ratios", "0.5,1"])
    assert "compression ratio 1 is outside [0, 1)" in capsys.readouterr().err


def test_the_abstract_kvpress_base_is_not_offered():
    with pytest.raises(ValueError) as error:
        presses.get("kvpress:NoSuchPress")
    assert "KnormPress" in str(error.value) and "ScorerPress," not in str(error.value)
    with pytest.raises(ValueError, match="abstract base"):
        presses.get("kvpress:ScorerPress")


def test_allow_download_when_the_hub_is_offline(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError, match="the hub is offline because HF_HUB_OFFLINE is set") as error:
        loading.resolve(loading.ModelSpec("nobody/no-such-model", allow_download=True))
    assert "pass --allow-download" not in str(error.value)


def test_model_eval_and_calibrate_refuse_empty_work(model_dir, capsys, no_model_load):
    code, err = _cli(capsys, "model-eval", "--model", model_dir, "--n", "0")
    assert code == 2 and "--n 0: give at least 1 item per task" in err
    code, err = _cli(capsys, "calibrate", "--model", model_dir, "--tokens", "0")
    assert code == 2 and "--tokens 0: give a positive number of tokens" in err


# 9. --jobs capped at the contexts, warned above the cores
def test_jobs_are_capped_at_the_contexts_and_warned_above_the_cores(model_dir, tmp_path, capsys, monkeypatch):
    import os

    import bench.compare
    from bench.execution import ContextWorker

    pools = []

    def in_this_process(settings, jobs, workers):  # the workers' protocol, here: no model-loading processes in a test
        pools.append(workers)
        worker = ContextWorker(settings)
        return map(worker.rows, jobs)

    monkeypatch.setattr(bench.compare, "in_processes", in_this_process)
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    capsys.readouterr()
    run_compare(_settings(model_dir, tmp_path / "one", jobs=64), show_progress=False)
    err = capsys.readouterr().err
    assert "--jobs 64 capped at 1: the run has 1 context(s)" in err and not pools
    run_compare(_settings(model_dir, tmp_path / "two", n=2, jobs=64), show_progress=False)
    err = capsys.readouterr().err
    assert "capped at 2" in err and "warning: 2 worker processes on 1 CPU core(s)" in err
    assert pools == [2]


# 10. library messages
def test_library_messages_say_what_is_wrong(tiny):
    model = tiny("qwen3_5")
    with pytest.raises(ValueError, match="context_ids is empty: give at least one token id"):
        prefill(model, torch.tensor([]))
    for dtype in (torch.int8, torch.uint8):
        with pytest.raises(ValueError, match=f"must be of an integer type int64 or int32, got {dtype}"):
            prefill(model, torch.tensor([1, 2, 3], dtype=dtype))
    parent = prefill(model, torch.arange(20))
    parent.release()
    with pytest.raises(RuntimeError, match="this parent was released; its cache and evidence are gone: prefill "
                                           "the context again"):
        parent.fork(KeepPlan({}))


def test_a_selection_without_its_evidence_says_which(tiny):
    for name, missing in [("kvpress:SnapKVPress", "the attention layers' inputs of the last 60 context tokens"),
                          ("snapkv", "the attention layers' inputs of the last 32 context tokens"),
                          ("gatesight", "the GDN signals")]:
        press = presses.get(name)
        if name == "gatesight":
            press = presses.get(name, estimator=presses.GateSightEstimator.random(_parent(tiny).adapter))
        with pytest.raises(ValueError, match=f"reads {missing}.*pass evidence=press.evidence\\(adapter\\) to prefill"):
            presses.Selection(_parent(tiny), press)


def test_the_pipeline_names_a_wrong_argument(tiny):
    from hybridmodel.tokenizer import build_tokenizer
    from presses.keydiff import KeyDiffPress

    pipe = presses.pipeline(tiny("qwen3_5"), build_tokenizer())
    with pytest.raises(TypeError, match=r"press must be .* got the class KeyDiffPress \(pass an instance: "
                                        r"KeyDiffPress\(\)\)"):
        pipe("some context", ["q?"], press=KeyDiffPress, keep_fraction=0.5)
    with pytest.raises(TypeError, match="questions must be a string or a list of strings, got NoneType None"):
        pipe("some context", None, press="keydiff", keep_fraction=0.5)
    with pytest.raises(TypeError, match="context must be a string"):
        pipe(None, ["q?"], press="keydiff", keep_fraction=0.5)


def test_a_damaged_artifact_is_named_by_the_library(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    copy = _copy(model_dir, tmp_path)
    _truncate(copy / "gatesight" / "gatesight.safetensors")
    model = AutoModelForCausalLM.from_pretrained(copy).eval()
    parent = prefill(model, torch.arange(40), protected=4, evidence=presses.get("gatesight").evidence(None))
    with pytest.raises(ValueError, match=f"{copy}: the artifacts press 'gatesight' reads there are damaged"):
        presses.Selection(parent, "gatesight")

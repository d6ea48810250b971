"""A hostile but fair user: mixed settings, concurrent writers, broken stores, bad input (CLI and library)."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

import allocators
import presses
from allocators import BudgetRequest
from bench import compare, loading
from bench.cli import main
from bench.compare import CompareSettings, run_compare, run_rows
from bench.store import RESULT_SOURCES, ResultStore, _normalised_source
from presses.selection import plan_for
from runtime import EvidenceRequest, KeepPlan, prefill


def _settings(model_dir, out, **kw):
    base = dict(presses=["keydiff", "none"], allocators=["flat"], ratios=[0.5], tasks=["niah_single_1"], n=1,
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
    assert not any(s in RESULT_SOURCES for s in ("bench/report.py", "bench/cli.py", "bench/stats.py", "bench"))


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
    from bench.report import write_leaderboard

    assert write_leaderboard([tmp_path], tmp_path / "docs").exists()


def test_a_store_from_before_the_fidelity_metrics_is_refused(model_dir, tmp_path):
    old = {"model": "m", "press": "none", "allocator": "none", "ratio": 1.0, "task": "vt", "item": 0, "score": 1.0}
    (tmp_path / "results.jsonl").write_text(json.dumps(old) + "\n")
    before = (tmp_path / "results.jsonl").read_bytes()
    with pytest.raises(ValueError, match="1 row\\(s\\) written before the fidelity metrics"):
        run_compare(_settings(model_dir, tmp_path), show_progress=False)
    assert (tmp_path / "results.jsonl").read_bytes() == before


# ---- 4. CLI errors before work ------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--ratios", ""], "--ratios is empty"),
    (["--press", ""], "--press is empty"),
    (["--alloc", ""], "--alloc is empty"),
    (["--tasks", ""], "--tasks is empty"),
    (["--press", "kvpress"], "name the kvpress scorer to wrap: kvpress:<ClassName>"),
    (["--press", "kvpress:NoSuchPress"], "'NoSuchPress' is not a kvpress ScorerPress; available: .*KnormPress"),
    (["--length", "10000000"], "length 10000000 is longer than the model's position limit"),
    (["--ratios", "0.5,1.5"], r"ratio 1.5 is outside \(0, 1\]"),
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
        plan_for(parent, {**scores, first: scores[first].masked_fill(torch.rand_like(scores[first]) < 0.1, float("nan"))},
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
    with pytest.raises(ValueError, match=r"context_ids\[2\] = 97 is not a token id of this model: ids must be in \[0, 97\)"):
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
            (dict(presses=["snapkv"]), "press 'snapkv' does not run in the vLLM engine"),
            (dict(presses=["keydiff"], allocators=["pyramid"]), "allocator 'flat' only"),
            (dict(presses=["keydiff"], jobs=2), "the vLLM engine runs in one process"),
        ]:
            with pytest.raises(ValueError, match=message):
                compare.validate(CompareSettings(**settings, engine="vllm", out=tmp_path))


def test_rows_from_before_the_engine_field_read_as_the_runtimes(tmp_path):
    row = {"schema": 2, "model": "m", "weights": "w", "press": "none", "allocator": "none", "ratio": 1.0,
           "task": "vt", "profile": "compact", "length": 512, "item": 0, "question": 0, "seed": 0, "code": "c"}
    (tmp_path / "results.jsonl").write_text(json.dumps(row) + "\n")
    (stored,) = ResultStore(tmp_path, readonly=True).rows
    assert stored["engine"] == "hf"

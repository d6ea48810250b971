"""The README's "Write your own press", run as written: one module and its registry entry, and the press runs
through compare, cost, the pipeline and the leaderboard with no other edit."""

import importlib
import re
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import allocators
import presses
from allocators.integerize import round_half_up
from bench.reports.leaderboard import write_leaderboard
from bench.run.compare import CompareSettings, run_compare
from bench.run.cost import run_cost
from presses import registry
from runtime import encode_text, prefill

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture
def recency(tmp_path, monkeypatch):
    """The README's block written to a module of its own and imported; the registry is restored afterwards."""
    section = README.read_text().split("### Write your own press", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (tmp_path / "my_press.py").write_text(code)
    monkeypatch.setattr(registry, "PRESSES", dict(registry.PRESSES))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("my_press")
    yield module
    sys.modules.pop("my_press", None)


def test_the_readme_press_keeps_the_most_recent_entries(recency, model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    parent = prefill(model, torch.arange(3, 203) % 90, protected=8)
    plan = presses.Selection(parent, "recency").plan("flat", 0.25)
    k = round(0.25 * (200 - 8))
    for heads in plan.layers.values():
        assert all(head.tolist() == list(range(200 - k, 200)) for head in heads)  # the last k, after the prefix
    with pytest.raises(ValueError, match="taken by my_press.RecencyPress: "):
        presses.register(type("RecencyPress2", (recency.RecencyPress,), {}))


@pytest.mark.parametrize("allocator", [name for name in allocators.available() if name != "global"])
def test_every_allocator_keeps_the_top_of_the_readme_press_scores_at_the_exact_budget(recency, model_dir, allocator):
    """Per head, the kept positions are a brute-force top-k of the press's own scores (k: the head's count), and the
    counts sum to B = L_attn · H_kv · round(p · (n − prot)) (``global`` refuses a press without one scale)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    parent = prefill(model, torch.arange(3, 203) % 90, protected=8)
    selection = presses.Selection(parent, recency.RecencyPress(decay=0.5))
    heads = parent.adapter.geometry.num_kv_heads
    layers = parent.adapter.attention_layers
    options = {"perlayer": {"weights": [1.0 + 2 * k for k in range(len(layers))]}}.get(allocator, {})
    selection.layer_weights = {layer: 1.0 + layer for layer in layers}  # for gate
    plan = selection.plan(allocators.get(allocator, **options), 0.25)
    assert sum(len(head) for kept in plan.layers.values() for head in kept) == len(layers) * heads * round(
        0.25 * (200 - 8))
    for layer, kept in plan.layers.items():
        for h, positions in enumerate(kept):
            top = torch.topk(selection.scores[layer][h], len(positions)).indices + parent.protected
            assert positions.tolist() == sorted(top.tolist()), (layer, h)


def test_the_readme_press_runs_everywhere_with_no_other_edit(recency, model_dir, tmp_path):
    settings = CompareSettings(presses=["recency", "none"], allocators=["flat", "pyramid"], keep_fractions=[0.3],
                               tasks=["niah_single_1"], n=2, length=384, model=str(model_dir), out=tmp_path / "run",
                               press_options={"decay": "0.5"})
    rows = run_compare(settings, show_progress=False).rows
    assert {(r["press"], r["allocator"]) for r in rows} == {("recency(decay=0.5)", "flat"),
                                                            ("recency(decay=0.5)", "pyramid"), ("none", "none")}
    compacted = [r for r in rows if r["press"] != "none"]
    # 2 attention layers × 2 KV heads, each allocator's counts summing exactly to the budget
    assert compacted and all(r["kept_entries"] == 2 * 2 * round_half_up(0.3 * (r["n_context"] - r["protected"]))
                             for r in compacted)
    assert "recency(decay=0.5)/pyramid" in write_leaderboard([tmp_path / "run"], tmp_path / "docs").read_text()
    (cost,) = run_cost(str(model_dir), ["recency"], [128], tmp_path / "cost")
    assert cost["press"] == "recency" and cost["score_s"] > 0
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pipe = presses.pipeline(model, tokenizer, max_new_tokens=4)
    answer = pipe("one two three four", "Which?", press="recency", keep_fraction=0.5)
    assert isinstance(answer, str) and len(encode_text(tokenizer, answer)) <= 4
    # by name or as an instance, with any positive decay (the same ranking): the same kept entries, the same answer
    assert pipe("one two three four", "Which?", press=recency.RecencyPress(decay=3.0), keep_fraction=0.5) == answer

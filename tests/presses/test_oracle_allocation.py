"""``benchmarks/oracle_allocation.py``: GateSight's ranking carrying KVzip's scores keeps KVzip/global's per-head
counts at every kept fraction and GateSight's top entries inside each head."""

import importlib
from pathlib import Path

import pytest
import torch

import allocators
import presses
from pretrained.loading import load
from pretrained.model_info import read
from runtime import prefill

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def oracle():
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))
        return importlib.import_module("oracle_allocation")


def test_reorder_keeps_the_values_of_each_head_in_the_rankings_order(oracle):
    g = torch.Generator().manual_seed(0)
    ranking, values = torch.rand(3, 40, generator=g), torch.rand(3, 40, generator=g)
    out = oracle.reorder_by(ranking, values)
    assert torch.equal(out.sort(1).values, values.sort(1).values)  # each head's multiset of values
    assert torch.equal(out.argsort(1, descending=True), ranking.argsort(1, descending=True))


def test_the_oracle_plan_has_kvzips_counts_and_gatesights_choice(oracle, model_dir):
    model, tokenizer, _ = load(str(model_dir))
    press = oracle.GateSightOraclePress()
    adapter = __import__("runtime").adapter_for(model)
    press.bind(read(model_dir))
    parent = prefill(model, torch.arange(3, 203) % 90, protected=8, evidence=press.evidence(adapter),
                     tokenizer=tokenizer)
    oracle_selection = presses.Selection(parent, press)
    kvzip, gatesight = presses.Selection(parent, "kvzip"), presses.Selection(parent, press.gatesight)
    for p in (0.05, 0.1, 0.3, 0.5):
        plan, kvzip_plan = oracle_selection.plan("global", p), kvzip.plan("global", p)
        counts = {layer: [len(h) for h in heads] for layer, heads in plan.layers.items()}
        assert counts == {layer: [len(h) for h in heads] for layer, heads in kvzip_plan.layers.items()}
        request = allocators.BudgetRequest(p, 192, adapter.attention_layers, adapter.geometry.num_kv_heads)
        assert sum(c for heads in counts.values() for c in heads) == request.total
        for layer, heads in plan.layers.items():
            for h, kept in enumerate(heads):
                top = torch.sort(-gatesight.scores[layer][h], stable=True).indices[: len(kept)] + 8
                assert sorted(kept.tolist()) == sorted(top.tolist())

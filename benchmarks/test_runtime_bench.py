"""pytest-benchmark timings of the runtime and of every press on a tiny Qwen3.5 (``pytest benchmarks
--benchmark-enable``). Ratios (p = 0.1 child against the full cache, scoring against prefill) are read off one
run's table."""

import pytest
import torch

from runtime import KeepPlan, adapter_for, prefill
from testing.offline import REGISTERED_PRESSES, offline_press
from testing.tiny_models import tiny_model

LENGTHS = [1024, 4096, 16384]


@pytest.fixture(scope="module")
def model():
    return tiny_model("qwen3_5", num_hidden_layers=8)


def _context(n):
    return torch.randint(0, 97, (n,), generator=torch.Generator().manual_seed(n))


def _tenth(parent):
    g = torch.Generator().manual_seed(0)
    body = parent.n - parent.protected
    k = body // 10
    return KeepPlan({layer: [torch.sort(torch.randperm(body, generator=g)[:k]).values + parent.protected
                             for _ in range(2)] for layer in parent.adapter.attention_layers})


@pytest.mark.parametrize("n", LENGTHS)
def test_prefill(benchmark, model, n):
    benchmark.group = f"runtime n={n}"
    benchmark.pedantic(lambda: prefill(model, _context(n)).release(), rounds=3, warmup_rounds=1)


@pytest.mark.parametrize("n", LENGTHS)
def test_fork_tenth(benchmark, model, n):
    benchmark.group = f"runtime n={n}"
    parent = prefill(model, _context(n))
    plan = _tenth(parent)
    benchmark.pedantic(lambda: parent.fork(plan).release(), rounds=5, warmup_rounds=1)


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("kept", ["full", "tenth"])
def test_decode_step(benchmark, model, n, kept):
    benchmark.group = f"decode n={n}"
    parent = prefill(model, _context(n))
    child = parent.fork(parent.keep_all_plan() if kept == "full" else _tenth(parent))
    parent.release()
    question = torch.tensor([5])
    benchmark.pedantic(lambda: child.logits(question), rounds=10, warmup_rounds=2)


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("name", REGISTERED_PRESSES)
def test_scoring(benchmark, model, n, name):
    benchmark.group = f"scoring n={n}"
    adapter = adapter_for(model)
    press = offline_press(name, model)
    parent = prefill(model, _context(n), evidence=press.evidence(adapter))
    benchmark.pedantic(lambda: press.score(parent), rounds=3, warmup_rounds=1)

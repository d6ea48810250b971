"""Compaction inside vLLM (stage 1): freed blocks, keep-all, token equality with the runtime's child for one plan.

Runs only in the serving environment (``scripts/serving_env.sh``; ``pytest -m vllm``): vLLM's CPU build brings a
transformers that kvpress does not accept. The model is a tiny random Qwen3-Next whose GDN head dim (64) the CPU GDN
kernel accepts, saved in bfloat16 (vLLM's CPU GDN layers need it) with a random GateSight estimator beside it.
"""

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="the serving environment has vLLM: scripts/serving_env.sh")

import presses  # noqa: E402
from runtime import EvidenceRequest, KeepPlan, adapter_for, prefill  # noqa: E402

pytestmark = pytest.mark.vllm

VOCAB = 512
PROTECTED = 4


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``(engine, hf_model)`` on one tiny Qwen3-Next directory."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    from presses.gatesight import GateSightEstimator
    from serving import CompactingLLM

    directory = tmp_path_factory.mktemp("tiny-next")
    torch.manual_seed(0)
    config = Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
        linear_value_head_dim=64, full_attention_interval=2, intermediate_size=512, moe_intermediate_size=128,
        shared_expert_intermediate_size=128, num_experts=4, num_experts_per_tok=2, max_position_embeddings=8192,
    )
    model = Qwen3NextForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(directory)
    GateSightEstimator.random(adapter_for(model), seed=3).save(directory / "gatesight")
    model = Qwen3NextForCausalLM.from_pretrained(directory, dtype=torch.bfloat16).eval()  # finds its estimator
    engine = CompactingLLM(str(directory), press="keydiff", max_model_len=4096, max_num_seqs=4,
                           gpu_memory_utilization=0.2, kv_cache_memory_bytes=256 * 2**20)
    return engine, model


def _ids(n, seed):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _runtime_deficits(model, ids, plan: dict, tokens: list[int]) -> torch.Tensor:
    """Per generated token: how far below the runtime's best logit it is, the runtime teacher-forced on ``tokens``
    (the first from the parent's last logits, the rest from the child of ``plan``). 0 where it is the argmax."""
    parent = prefill(model, torch.tensor(ids), protected=PROTECTED)
    child = parent.fork(KeepPlan({int(layer): [torch.tensor(h) for h in heads] for layer, heads in plan.items()}))
    logits = torch.cat([parent.last_logits[None], child.logits(torch.tensor(tokens[:-1]))]).float()
    return logits.max(-1).values - logits.gather(1, torch.tensor(tokens)[:, None])[:, 0]


def test_keep_all_equals_no_plugin(served):
    engine, _ = served
    engine.use_press("keydiff")
    ids = _ids(700, 1)
    result = engine.generate(ids, keep_fraction=1.0, max_tokens=12, protected=PROTECTED)
    assert result.kept == result.n == 700 and result.freed_blocks == 0
    assert result.tokens == engine.generate_plain(ids, 12)


@pytest.mark.parametrize("n,keep_fraction", [(300, 0.5), (700, 0.1), (1100, 0.2)])
def test_freed_blocks_are_exactly_the_planned_tail(served, n, keep_fraction):
    engine, _ = served
    engine.use_press("keydiff")
    idle = engine.free_blocks
    result = engine.generate(_ids(n, n), keep_fraction=keep_fraction, max_tokens=4, protected=PROTECTED)
    block = engine.layout["block_size"]
    body = n - PROTECTED
    assert abs(result.kept - PROTECTED - keep_fraction * body) <= 1
    assert all(len(head) == result.kept - PROTECTED for heads in result.plan.values() for head in heads)
    planned = -(-n // block) - -(-result.kept // block)
    assert result.freed_blocks == planned
    assert result.free_blocks_after - result.free_blocks_before == planned
    assert engine.free_blocks == idle  # every block back once the request finished


@pytest.mark.parametrize("press", ["keydiff", "gatesight"])
@pytest.mark.parametrize("n,seed", [(300, 11), (700, 12), (1100, 13)])
def test_tokens_are_the_runtime_childs_greedy_choices(served, press, n, seed):
    """Every token vLLM generates after compaction is the runtime child's argmax for the same plan, up to bf16
    near-ties: the random model's logits spread 0.32 (std) and its top two often differ by one bf16 ulp (0.008),
    so the two backends' summation orders may pick either of a tie. Measured: at most 0.04 below the best logit;
    with the keys not re-rotated to the engine's positions, 0.12-0.49 (so 0.0625 separates right from wrong)."""
    engine, model = served
    engine.use_press(press)
    ids = _ids(n, seed)
    result = engine.generate(ids, keep_fraction=0.2, max_tokens=10, protected=PROTECTED)
    assert result.kept < n and len(result.tokens) == 10
    deficits = _runtime_deficits(model, ids, result.plan, result.tokens)
    assert deficits[0] == 0  # the first token comes from the full context in both
    assert deficits.max() < 0.0625


def test_gatesight_reads_the_signals_of_vllms_forward(served):
    """β, g, ‖v‖ recorded from vLLM's GDN op equal the runtime's on the first GDN layer (both see the same bf16
    embeddings; later layers inherit bf16 differences of the layers between), and the kept sets are the runtime's
    GateSight sets but for a few near-ties."""
    engine, model = served
    engine.use_press("gatesight")
    ids = _ids(600, 21)
    result = engine.generate(ids, keep_fraction=0.2, max_tokens=2, protected=PROTECTED)
    recorded = engine.llm.collective_rpc("hybridpress_signals")[0]
    parent = prefill(model, torch.tensor(ids), protected=PROTECTED, evidence=EvidenceRequest(gdn_signals=True))
    first = min(recorded)
    assert set(recorded) == set(parent.evidence.gdn_signals)
    reference = parent.evidence.gdn_signals[first]
    assert recorded[first].shape == reference.shape == (600, 4, 3)
    # bf16 rounding of b, a and v (8 mantissa bits): 2^-7 relative
    assert torch.allclose(recorded[first], reference, rtol=2**-7, atol=1e-3)
    ours = presses.Selection(parent, "gatesight").plan("flat", 0.2)
    overlaps = [len(set(result.plan[layer][h]) & set(kept.tolist())) / len(kept)
                for layer, heads in ours.layers.items() for h, kept in enumerate(heads)]
    assert min(overlaps) >= 0.95


def test_presses_and_plans_the_engine_cannot_run_are_refused(served):
    engine, _ = served
    with pytest.raises(ValueError, match="snapkv reads the queries of the context's last tokens"):
        engine.use_press("snapkv")
    engine.use_press("keydiff")
    idle = engine.free_blocks
    for allocator in ("adakv", "pyramid", "global"):
        with pytest.raises(ValueError, match=f"allocator={allocator!r}: the engine compacts equal counts per layer"):
            engine.generate(_ids(400, 5), keep_fraction=0.2, max_tokens=4, protected=PROTECTED, allocator=allocator)
    with pytest.raises(ValueError, match=r"keep_fraction 0 is outside \(0, 1\]"):
        engine.generate(_ids(400, 5), keep_fraction=0, max_tokens=4, protected=PROTECTED)
    assert engine.free_blocks == idle and not engine.scheduler.requests  # refused before any work

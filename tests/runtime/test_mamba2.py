"""Mamba2 hybrids (Bamba, Granite 4.0-H, Falcon-H1): the Mamba2 continuation kernel against transformers' own torch
path and the literal recurrence; the families and configurations that are refused, with their reasons. GateSight
on them: tests/learning/test_mamba2_gatesight.py.

The runtime's invariants, the presses and the kvpress bridge are held on these families by the same tests that
hold them on the GDN and dense ones (``test_fork``, ``test_chunked_and_bf16``, ``test_batch``,
``tests/presses/test_presses.py``, ``tests/presses/test_kvpress_bridge.py``: parametrised over every family), so
that both kinds of hybrid answer to one definition of each invariant.
"""

import pytest
import torch
from transformers import (
    GraniteMoeHybridConfig,
    GraniteMoeHybridForCausalLM,
    JambaConfig,
    JambaForCausalLM,
    Zamba2Config,
    Zamba2ForCausalLM,
)

from allocators.integerize import round_half_up
from bench.commands.cli import main
from bench.store.result_store import ResultStore
from runtime import adapter_for, prefill
from runtime.adapters.tiny import VOCAB, mamba2_common
from runtime.mamba2 import mamba2_forward, ssd_scan
from testing.tiny_models import MODELS
from tests.helpers import MAMBA2_FAMILIES as FAMILIES
from tests.helpers import save_bamba, token_ids


# ---- the kernel --------------------------------------------------------------------------------------------------
def _recurrence(x, dt, A, B, C, state):
    """h_t = exp(Δ_t A) h_{t-1} + Δ_t x_t ⊗ B_t, y_t = h_t C_t, one token at a time (the definition)."""
    outputs = []
    for t in range(x.shape[0]):
        state = state * torch.exp(dt[t] * A)[:, None, None] + (dt[t][:, None] * x[t])[..., None] * B[t][:, None, :]
        outputs.append(torch.einsum("hpn,hn->hp", state, C[t]))
    return torch.stack(outputs), state


@pytest.mark.parametrize("length, chunk", [(1, 8), (13, 1), (13, 5), (40, 8), (40, 64)])
def test_ssd_scan_equals_the_recurrence_from_any_state(length, chunk):
    g = torch.Generator().manual_seed(length * 100 + chunk)
    heads, dim, state_size = 3, 4, 5
    x, B, C = (torch.randn(length, heads, d, generator=g) for d in (dim, state_size, state_size))
    dt = torch.rand(length, heads, generator=g) * 0.5
    A = -torch.rand(heads, generator=g) * 4
    initial = torch.randn(heads, dim, state_size, generator=g)
    y, state = ssd_scan(x, dt, A, B, C, initial, chunk)
    y_ref, state_ref = _recurrence(x, dt, A, B, C, initial)
    assert torch.allclose(y, y_ref, atol=1e-5, rtol=1e-5)
    assert torch.allclose(state, state_ref, atol=1e-5, rtol=1e-5)


#: each family's tiny model, and Falcon-H1's other gating: without its optional norm (the gate multiplies the scan
#: output), and with the norm before the gate
MIXER_CASES = [(family, {}) for family in FAMILIES] + [("falcon_h1", {"mamba_rms_norm": False}),
                                                       ("falcon_h1", {"mamba_norm_before_gate": True})]


@pytest.mark.parametrize("family, options", MIXER_CASES)
@pytest.mark.parametrize("pieces", [[150], [1, 1, 148], [7, 64, 79], [64, 86]])
@torch.no_grad()
def test_mixer_continued_in_pieces_equals_transformers_torch_path(family, options, pieces):
    """Each Mamba2 layer, run piece by piece from its cached states, equals transformers' ``torch_forward`` over
    the whole sequence in one pass (8-token scan chunks: pieces start and end inside chunks), to 1e-5 of the output's
    scale; the same pieces from a zero state miss by far more."""
    model = MODELS[family](**options)
    adapter = adapter_for(model)
    hidden = torch.randn(1, 150, model.config.hidden_size, generator=torch.Generator().manual_seed(3))
    # the layer scales its mixer's output on the residual; the adapter folds that multiplier in
    multiplier = {"granitemoehybrid": "residual_multiplier", "falcon_h1": "ssm_out_multiplier"}
    factor = getattr(model.config, multiplier[family]) if family in multiplier else 1.0
    for layer in adapter.mamba2_layers:
        reference = adapter.mamba_module(layer).torch_forward(hidden) * factor
        tolerance = 1e-5 * float(reference.abs().max())
        continued, restarted, state, start = [], [], None, 0
        for piece in pieces:
            out, state, _ = mamba2_forward(adapter, layer, hidden[:, start : start + piece], state, False)
            continued.append(out)
            restarted.append(mamba2_forward(adapter, layer, hidden[:, start : start + piece], None, False)[0])
            start += piece
        assert (torch.cat(continued, 1) - reference).abs().max() <= tolerance, layer
        if len(pieces) > 1:
            assert (torch.cat(restarted, 1) - reference).abs().max() > 100 * tolerance, layer


@pytest.mark.parametrize("family", FAMILIES)
def test_the_mamba2_state_carries_the_context(tiny, family):
    """A question answered from a zeroed SSM state differs far beyond the 1e-4 of the keep-all test, so that test
    would catch a lost or mangled state."""
    parent = prefill(tiny(family), token_ids(120, 1), protected=5)
    child = parent.fork(parent.keep_all_plan())
    question = token_ids(9, 2)
    kept = child.logits(question)
    for state in child.recurrent_states.values():
        state.recurrent.zero_()
    assert (child.logits(question) - kept).abs().max() > 1e-3


def test_the_tiny_granite_routes_tokens_to_every_expert(tiny):
    """Every MoE block sends some tokens of one context to each expert, so the invariant runs (the batched one
    included, which evaluates the experts densely) cover a router whose choice differs token by token."""
    model = tiny("granitemoehybrid")
    sizes = {}
    hooks = [layer.block_sparse_moe.router.register_forward_hook(
        lambda module, args, out, i=i: sizes.__setitem__(i, out[3])) for i, layer in enumerate(model.model.layers)]
    try:
        model(token_ids(120, 0)[None])
    finally:
        for hook in hooks:
            hook.remove()
    assert len(sizes) == 4 and all(min(per_expert) > 0 for per_expert in sizes.values()), sizes


@torch.no_grad()
def test_transformers_multi_token_continuation_drops_the_state(tiny):
    """Why the kernel exists: transformers' own cache continues a Mamba2 layer only one token at a time; a question
    of several tokens after a cached context restarts the SSM state and the conv window, and misses one pass."""
    from transformers.models.bamba.modeling_bamba import HybridMambaAttentionDynamicCache

    model = tiny("bamba")
    context, question = token_ids(120, 1), token_ids(9, 2)
    one_pass = model(torch.cat([context, question])[None]).logits[0, 120:]
    cache = HybridMambaAttentionDynamicCache(model.config, 1, dtype=torch.float32)
    model(context[None], past_key_values=cache, use_cache=True)
    cached = model(question[None], past_key_values=cache, use_cache=True, cache_position=torch.arange(120, 129))
    assert (cached.logits[0] - one_pass).abs().max() > 1e-2
    assert torch.allclose(prefill(model, context).logits(question), one_pass, atol=1e-4, rtol=0)


def test_the_dense_granite_has_no_experts(tiny):
    """The configuration the runtime's invariants also run on (``granitemoehybrid-dense``): Granite 4.0-H's MLPs the
    shared MLP alone."""
    assert all(layer.block_sparse_moe is None for layer in tiny("granitemoehybrid-dense").model.layers)


def test_bench_compare_runs_on_a_saved_bamba_checkpoint(tmp_path):
    """How a hub checkpoint arrives: a model directory with its tokenizer (the byte tokenizer's vocabulary)."""
    directory = tmp_path / "model"
    save_bamba(directory)
    out = tmp_path / "out"
    common = ["--alloc", "flat", "--keep-fractions", "0.5", "--tasks", "niah_single_1", "--n", "1", "--length", "300"]
    assert main(["compare", "--model", str(directory), "--press", "keydiff,snapkv", *common, "--out", str(out)]) == 0
    rows = ResultStore(out, readonly=True).rows
    assert {row["press"] for row in rows} == {"none", "keydiff", "snapkv"}
    for row in rows:
        if row["press"] != "none":  # both attention layers × both KV heads keep half the body
            assert row["kept_entries"] == 2 * 2 * round_half_up(0.5 * (row["n_context"] - row["protected"]))


# ---- refused families ------------------------------------------------------------------------------------------------
def _jamba():
    config = JambaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, num_experts=1, attn_layer_period=2,
                         attn_layer_offset=1, mamba_d_state=4, mamba_dt_rank=4, use_mamba_kernels=False)
    return JambaForCausalLM(config)


def _zamba2():
    config = Zamba2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=4, mamba_d_state=8, mamba_headdim=8, n_mamba_heads=8,
                          layers_block_type=["mamba", "hybrid"], num_mem_blocks=1, adapter_rank=4)
    return Zamba2ForCausalLM(config)


@pytest.mark.parametrize("build, reason", [
    (_jamba, r"'jamba' \(JambaForCausalLM\) is not supported: its recurrent layers are Mamba1 .* no RoPE"),
    (_zamba2, r"'zamba2' \(Zamba2ForCausalLM\) is not supported: its attention is one shared transformer block"),
])
def test_hybrid_families_without_an_adapter_are_refused_with_the_reason(build, reason):
    with pytest.raises(ValueError, match=reason + r".*; supported: \[.*'bamba'.*'granitemoehybrid'"):
        adapter_for(build())


def test_granite_without_rope_is_refused_with_the_reason():
    torch.manual_seed(0)
    config = GraniteMoeHybridConfig(**mamba2_common(2), layer_types=["mamba", "attention"],
                                    position_embedding_type="nope", num_local_experts=0, shared_intermediate_size=24)
    with pytest.raises(ValueError, match=r"position_embedding_type='nope' is not supported: only 'rope' is"):
        adapter_for(GraniteMoeHybridForCausalLM(config))


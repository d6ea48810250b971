"""Fork protocol invariants: keep-all = fresh run, compacted = masked full attention, honest bytes, isolation."""

import gc
import weakref

import pytest
import torch

from runtime import EvidenceRequest, KeepPlan, prefill
from runtime.adapters import apply_rope
from tests.helpers import FAMILIES_AND_REAL_MODEL, HYBRID_FAMILIES, token_ids


def _greedy_fresh(model, ids, steps):
    """Greedy decoding by recomputing the whole sequence each step: no cache anywhere."""
    out = []
    seq = ids.clone()
    for _ in range(steps):
        token = int(model(seq[None]).logits[0, -1].argmax())
        out.append(token)
        seq = torch.cat([seq, torch.tensor([token])])
    return out


def _random_plan(parent, seed, ragged):
    g = torch.Generator().manual_seed(seed)
    body = parent.n - parent.protected
    layers = {}
    for _, layer in enumerate(parent.adapter.attention_layers):
        layer_count = int(torch.randint(1, body + 1, (1,), generator=g))
        heads = []
        for _ in range(parent.adapter.geometry.num_kv_heads):
            count = int(torch.randint(0, body + 1, (1,), generator=g)) if ragged else layer_count
            heads.append(torch.sort(torch.randperm(body, generator=g)[:count]).values + parent.protected)
        layers[layer] = heads
    return KeepPlan(layers)


@pytest.mark.parametrize("family", [*FAMILIES_AND_REAL_MODEL, "granitemoehybrid-dense"])
def test_keep_all_fork_equals_fresh_run(tiny, family):
    model = tiny(family)
    context, question = token_ids(120, 1), token_ids(9, 2)
    parent = prefill(model, context, protected=5)
    child = parent.fork(parent.keep_all_plan())
    fresh = model(torch.cat([context, question])[None]).logits[0, 120:]
    assert torch.allclose(child.logits(question), fresh, atol=1e-4, rtol=0)
    assert child.answer(question, 8).tokens == _greedy_fresh(model, torch.cat([context, question]), 8)


class _OutputRecorder:
    wants_recurrent_signals = False

    def __init__(self):
        self.calls = {}

    def on_attention(self, layer_idx, hidden, query, gate, keys, values, output):
        self.calls[layer_idx] = (hidden, output)


def _masked_reference(adapter, parent, layer, hidden, kept_per_head, question_len):
    """The layer's output over the parent's full cache with evicted entries masked to -inf (eager, fp32)."""
    g = adapter.geometry
    n = parent.n
    positions = torch.arange(n, n + question_len)
    cos, sin = adapter.rope(hidden, positions)
    query, gate = adapter.project_query(layer, hidden)
    keys, values = adapter.project_kv(layer, hidden)
    query, keys = apply_rope(query, cos, sin), apply_rope(keys, cos, sin)
    full = parent.kv[layer]
    all_keys, all_values = torch.cat([full.keys, keys], 1), torch.cat([full.values, values], 1)
    mask = torch.full((g.num_kv_heads, question_len, n + question_len), float("-inf"))
    for h, kept in enumerate(kept_per_head):
        mask[h][:, torch.cat([torch.arange(parent.protected), kept])] = 0
        mask[h][:, n:] = torch.triu(torch.full((question_len, question_len), float("-inf")), 1)
    mask = mask.repeat_interleave(g.group_size, 0)
    key_rep = all_keys.repeat_interleave(g.group_size, 0)
    value_rep = all_values.repeat_interleave(g.group_size, 0)
    probs = (query @ key_rep.transpose(1, 2) * adapter.attention_module(layer).scaling + mask).softmax(-1)
    return adapter.output(layer, (probs @ value_rep).transpose(0, 1), gate)


@pytest.mark.parametrize("family", FAMILIES_AND_REAL_MODEL)
@pytest.mark.parametrize("ragged", [False, True])
@pytest.mark.parametrize("question_len", [11, 24])  # explicit logits below FUSED_MIN_QUERIES, fused kernels from it
def test_compacted_attention_equals_masked_full_attention(tiny, family, ragged, question_len):
    model = tiny(family)
    parent = prefill(model, token_ids(140, 3), protected=6)
    question = token_ids(question_len, 4)
    for seed in range(3):
        plan = _random_plan(parent, seed, ragged)
        child = parent.fork(plan)
        recorder = _OutputRecorder()
        child.logits(question, observer=recorder)
        for layer in parent.adapter.attention_layers:
            hidden, output = recorder.calls[layer]
            reference = _masked_reference(parent.adapter, parent, layer, hidden, plan.layers[layer], question_len)
            error = float((output - reference).abs().max())
            assert error <= 1e-5 * max(1.0, float(reference.abs().max())), (layer, seed, error)


@pytest.mark.parametrize("ragged", [False, True])
def test_child_bytes_are_the_kept_entries(tiny, ragged):
    parent = prefill(tiny("qwen3_5"), token_ids(200, 5), protected=8)
    g = parent.adapter.geometry
    plan = _random_plan(parent, 7, ragged)
    child = parent.fork(plan)
    element = parent.kv[parent.adapter.attention_layers[0]].keys.element_size()
    kept = sum(parent.protected + int(p.numel()) for heads in plan.layers.values() for p in heads)
    # dense layers store [H_kv, k, d]; ragged layers store one [k_h, d] tensor per head — both exactly Σ kept
    assert child.kv_nbytes == kept * 2 * g.head_dim * element
    assert parent.kv_nbytes == len(plan.layers) * g.num_kv_heads * parent.n * 2 * g.head_dim * element
    assert all(layer.ragged == ragged for layer in child.kv.values()) or not ragged


def test_release_frees_parent_storage(tiny):
    parent = prefill(tiny("qwen3_5"), token_ids(100, 6), protected=2)
    refs = [weakref.ref(layer.keys) for layer in parent.kv.values()]
    refs += [weakref.ref(layer.values) for layer in parent.kv.values()]
    child = parent.fork(_random_plan(parent, 1, ragged=True))
    before = child.answer(token_ids(5, 7), 4).tokens
    parent.release()
    gc.collect()
    assert all(ref() is None for ref in refs)
    assert parent.kv_nbytes == 0
    assert child.answer(token_ids(5, 7), 4).tokens == before
    child.release()
    assert child.kv_nbytes == 0 and child.released


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_child_recurrent_states_copied_and_questions_isolated(tiny, family):
    parent = prefill(tiny(family), token_ids(150, 8), protected=4)
    child = parent.fork(_random_plan(parent, 2, ragged=False))
    for layer, state in parent.recurrent_states.items():
        assert torch.equal(child.recurrent_states[layer].recurrent, state.recurrent)
        assert torch.equal(child.recurrent_states[layer].conv, state.conv)
        assert child.recurrent_states[layer].recurrent.data_ptr() != state.recurrent.data_ptr()
    q1, q2 = token_ids(6, 9), token_ids(13, 10)
    first = child.answer(q1, 6).tokens
    second = child.answer(q2, 6).tokens
    assert child.answer(q1, 6).tokens == first
    assert child.answer(q2, 6).tokens == second
    for layer, state in parent.recurrent_states.items():
        assert torch.equal(child.recurrent_states[layer].recurrent, state.recurrent)


def test_evidence_capture_does_not_change_outputs(tiny):
    model = tiny("qwen3_5")
    context = token_ids(90, 11)
    plain = prefill(model, context)
    request = EvidenceRequest(recurrent_signals=True, window=16)
    captured = prefill(model, context, evidence=request)
    assert torch.equal(plain.last_logits, captured.last_logits)
    ev = captured.evidence
    adapter = captured.adapter
    assert sorted(ev.recurrent_signals) == list(adapter.gdn_layers)
    assert ev.recurrent_signals[adapter.gdn_layers[0]].shape == (90, adapter.gdn_value_heads(), 3)
    assert ev.window_hidden[adapter.attention_layers[0]].shape == (16, model.config.hidden_size)
    assert not plain.evidence.recurrent_signals and not plain.evidence.window_hidden


def test_recurrent_signals_are_the_rule_inputs(tiny):
    """β = sigmoid(b), g = -exp(A_log)·softplus(a + dt_bias), ‖v‖ of the post-conv value, recomputed here."""
    model = tiny("qwen3_5")
    context = token_ids(40, 12)
    parent = prefill(model, context, evidence=EvidenceRequest(recurrent_signals=True))
    layer = parent.adapter.gdn_layers[0]
    module = model.model.layers[layer].linear_attn
    x = model.model.layers[layer].input_layernorm(model.model.embed_tokens(context[None]))
    beta = module.in_proj_b(x)[0].sigmoid()
    decay = -module.A_log.exp() * torch.nn.functional.softplus(module.in_proj_a(x)[0] + module.dt_bias)
    mixed = torch.nn.functional.silu(module.conv1d(module.in_proj_qkv(x).transpose(1, 2))[..., :40])[0].T
    value = mixed[:, 2 * module.key_dim:].reshape(40, module.num_v_heads, module.head_v_dim)
    signals = parent.evidence.recurrent_signals[layer]
    assert torch.allclose(signals[..., 0], beta, atol=1e-6)
    assert torch.allclose(signals[..., 1], decay, atol=1e-6)
    assert torch.allclose(signals[..., 2], value.norm(dim=-1), atol=1e-5)

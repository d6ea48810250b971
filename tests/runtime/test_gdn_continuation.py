"""The GDN layers continue from cached states for chunks of any length (the transformers 5.2 trap)."""

import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

from runtime import prefill
from runtime.gdn import chunk_gated_delta_rule, recurrent_gated_delta_step


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe", "qwen3_next"])
@pytest.mark.parametrize("question_len", [1, 7, 64, 200])
def test_prefill_then_question_equals_one_pass(tiny, family, question_len):
    model = tiny(family)
    generator = torch.Generator().manual_seed(question_len)
    context = torch.randint(0, model.config.vocab_size, (300,), generator=generator)
    question = torch.randint(0, model.config.vocab_size, (question_len,), generator=generator)
    reference = model(torch.cat([context, question])[None]).logits[0, context.numel():]
    parent = prefill(model, context)
    assert torch.allclose(parent.logits(question), reference, atol=1e-4, rtol=0)


def test_transformers_multi_token_path_drops_the_state(tiny):
    """The trap this runtime exists for: HF's cached multi-token forward differs from the one-pass forward."""
    model = tiny("qwen3_5")
    context, question = torch.arange(50) % 97, torch.arange(7) + 3
    out = model(context[None], use_cache=True)
    cached = model(question[None], past_key_values=out.past_key_values).logits[0]
    reference = model(torch.cat([context, question])[None]).logits[0, 50:]
    assert (cached - reference).abs().max() > 1e-3


def _random_rule_inputs(heads=3, length=150, dk=8, dv=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(heads, length, dk, generator=g), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(heads, length, dk, generator=g), dim=-1)
    v = torch.randn(heads, length, dv, generator=g)
    decay = -torch.rand(heads, length, generator=g) * 0.5
    beta = torch.rand(heads, length, generator=g)
    return q, k, v, decay, beta


def test_chunk_kernel_matches_transformers_and_recurrence():
    q, k, v, decay, beta = _random_rule_inputs()
    zeros = torch.zeros(3, 8, 6)
    ours, state = chunk_gated_delta_rule(q, k, v, decay, beta, zeros)
    theirs, their_state = torch_chunk_gated_delta_rule(
        *(t.transpose(0, 1)[None] for t in (q, k, v)), g=decay.T[None], beta=beta.T[None],
        output_final_state=True,
    )
    assert torch.allclose(ours, theirs[0].transpose(0, 1), atol=1e-5)
    assert torch.allclose(state, their_state[0], atol=1e-5)
    stepped, step_state = recurrent_gated_delta_step(q, k, v, decay, beta, zeros)
    assert torch.allclose(ours, stepped, atol=1e-5)
    assert torch.allclose(state, step_state, atol=1e-5)


def test_chunk_kernel_continues_from_initial_state():
    q, k, v, decay, beta = _random_rule_inputs(seed=1)
    whole, whole_state = chunk_gated_delta_rule(q, k, v, decay, beta, torch.zeros(3, 8, 6))
    first, mid_state = chunk_gated_delta_rule(q[:, :70], k[:, :70], v[:, :70], decay[:, :70], beta[:, :70],
                                              torch.zeros(3, 8, 6))
    second, end_state = chunk_gated_delta_rule(q[:, 70:], k[:, 70:], v[:, 70:], decay[:, 70:], beta[:, 70:], mid_state)
    assert torch.allclose(torch.cat([first, second], 1), whole, atol=1e-5)
    assert torch.allclose(end_state, whole_state, atol=1e-5)

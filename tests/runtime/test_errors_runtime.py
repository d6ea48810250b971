"""Every bad input to the runtime gives one clear error naming what is wrong."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from runtime import KeepPlan, prefill


@pytest.fixture(scope="module")
def parent(tiny):
    return prefill(tiny("qwen3_5"), torch.arange(60) % 97, protected=4)


def _plan_with(parent, layer_heads):
    plan = parent.keep_all_plan()
    plan.layers[parent.adapter.attention_layers[0]] = layer_heads
    return plan


def test_position_out_of_range(parent):
    with pytest.raises(ValueError, match=r"position 60 is outside the body \[4, 60\)"):
        parent.fork(_plan_with(parent, [torch.tensor([5, 60]), torch.tensor([5])]))
    with pytest.raises(ValueError, match=r"position 2 is outside"):
        parent.fork(_plan_with(parent, [torch.tensor([2, 9]), torch.tensor([5])]))


def test_duplicate_positions(parent):
    with pytest.raises(ValueError, match="strictly increasing"):
        parent.fork(_plan_with(parent, [torch.tensor([5, 5, 7]), torch.tensor([5])]))


def test_wrong_layers_or_heads(parent):
    with pytest.raises(ValueError, match="attention layers are"):
        parent.fork(KeepPlan({}))
    with pytest.raises(ValueError, match="has 1 heads; the model has 2 KV heads"):
        parent.fork(_plan_with(parent, [torch.tensor([5])]))


@pytest.mark.parametrize("protected", [60, 300, -1])
def test_protected_prefix_too_long(tiny, protected):
    with pytest.raises(ValueError, match=f"protected={protected} is not allowed"):
        prefill(tiny("qwen3_5"), torch.arange(60) % 97, protected=protected)


def test_empty_context(tiny):
    with pytest.raises(ValueError, match="context_ids is empty"):
        prefill(tiny("qwen3_5"), torch.tensor([], dtype=torch.long))


def test_over_long_context(tiny):
    with pytest.raises(ValueError, match="longer than the model's max_position_embeddings"):
        prefill(tiny("qwen3_5"), torch.zeros(32769, dtype=torch.long))


def test_unsupported_model():
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(ValueError, match=r"unsupported model type 'gpt2'.*supported: \['bamba', 'falcon_h1', "
                                         r"'granitemoehybrid', 'llama', 'qwen3', 'qwen3_5', 'qwen3_5_moe', "
                                         r"'qwen3_5_moe_text', 'qwen3_5_text', 'qwen3_next'\]"):
        prefill(model, torch.arange(10))


def test_wrong_hash_released_and_batched_questions(parent):
    child = parent.fork(parent.keep_all_plan())
    with pytest.raises(ValueError, match="context hash mismatch"):
        child.answer(torch.arange(3), 2, context_hash="0" * 64)
    assert child.answer(torch.arange(3), 2, context_hash=parent.context_hash).tokens
    with pytest.raises(ValueError, match="one sequence at a time"):
        child.answer(torch.arange(6).view(2, 3), 2)
    child.release()
    with pytest.raises(RuntimeError, match="was released"):
        child.answer(torch.arange(3), 2)


def test_reentrant_question_is_refused(parent):
    child = parent.fork(parent.keep_all_plan())

    class AskAgain:
        wants_recurrent_signals = False

        def on_attention(self, *args):
            child.answer(torch.arange(2), 1)

    with pytest.raises(RuntimeError, match="one question at a time"):
        child.logits(torch.arange(3), observer=AskAgain())

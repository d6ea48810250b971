"""Every bad input to the runtime gives one clear error naming what is wrong."""

import re

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from runtime import KeepPlan, prefill
from runtime.errors import ArgumentTypeError, UsageError
from runtime.evidence import EvidenceRequest


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


def test_a_released_cache_is_a_usage_error_and_still_a_runtime_error(tiny):
    """Used after release(): one line in the bench (a UsageError), and a RuntimeError as before for callers that
    catch that; answer, fork and compress alike."""
    import presses
    from runtime.errors import ReleasedError

    parent = prefill(tiny("qwen3_5"), torch.arange(20), protected=2)
    parent.release()
    calls = [lambda: parent.answer(torch.arange(3), 2), lambda: parent.fork(parent.keep_all_plan()),
             lambda: presses.compress(parent, "keydiff", "flat", keep_fraction=0.5)]
    for call in calls:
        with pytest.raises(ReleasedError, match="this parent was released; its cache and evidence are gone") as error:
            call()
        assert isinstance(error.value, UsageError) and isinstance(error.value, RuntimeError)


@pytest.mark.parametrize("evidence", ["attention", {"recurrent_signals": True}, None])
def test_evidence_that_is_not_a_request_is_named(tiny, evidence):
    with pytest.raises(ArgumentTypeError, match=re.escape(
            f"evidence must be an EvidenceRequest (what the presses in use read besides the KV cache: "
            f"press.evidence(adapter), or presses.preparation.evidence_for(presses, adapter) for several), got "
            f"{type(evidence).__name__}")):
        prefill(tiny("qwen3_5"), torch.arange(20), evidence=evidence)


@pytest.mark.parametrize("request_fields, message", [
    (dict(window=-1), r"window \(context tokens .*\) must be an integer >= 0, got -1"),
    (dict(window=2.5), r"window .* must be an integer >= 0, got 2.5"),
    (dict(recurrent_signals=1), "recurrent_signals must be True or False, got 1"),
    (dict(signal_dtype=torch.int8), "signal_dtype must be a floating torch dtype .*, got torch.int8"),
    (dict(signal_dtype="float32"), "signal_dtype must be a floating torch dtype .*, got 'float32'")])
def test_an_evidence_request_of_impossible_fields_is_named_where_it_is_made(request_fields, message):
    with pytest.raises(ValueError, match=message):
        EvidenceRequest(**request_fields)
    assert EvidenceRequest(window=np.int64(3)).window == 3 and EvidenceRequest(window=0).window == 0


def test_reentrant_question_is_refused(parent):
    child = parent.fork(parent.keep_all_plan())

    class AskAgain:
        wants_recurrent_signals = False

        def on_attention(self, *args):
            child.answer(torch.arange(2), 1)

    with pytest.raises(RuntimeError, match="one question at a time"):
        child.logits(torch.arange(3), observer=AskAgain())


@pytest.fixture
def no_decoding(monkeypatch):
    """Any forward pass fails the test: a refused question must be refused before the model runs."""
    import runtime.batch
    import runtime.session

    def fail(*args, **kwargs):
        pytest.fail("the model ran before the bad request was refused")

    monkeypatch.setattr(runtime.session, "forward_chunk", fail)
    monkeypatch.setattr(runtime.batch, "vmap", lambda *a, **k: fail)


@pytest.mark.parametrize("answer", ["parent", "child", "batch"])
def test_an_answer_past_the_models_positions_is_refused_before_decoding(parent, no_decoding, answer):
    from runtime.batch import answer_many

    child = parent.fork(parent.keep_all_plan())
    ask = {"parent": parent.answer, "child": child.answer,
           "batch": lambda q, m: answer_many([child, child], q, m)}[answer]
    with pytest.raises(UsageError, match=r"the context \(60 tokens\), the question \(3\) and max_new_tokens=1000000000 "
                                         r"need 1000000063 positions; the model has 32768 \(max_position_embeddings\): "
                                         r"give max_new_tokens <= 32705"):
        ask(torch.arange(3), 10**9)


def test_the_answer_may_use_every_position_and_not_one_more(parent, monkeypatch):
    child = parent.fork(parent.keep_all_plan())
    monkeypatch.setattr(parent.adapter.config, "max_position_embeddings", 60 + 3 + 5)
    assert len(child.answer(torch.arange(3), 5).tokens) == 5  # no end of sequence given: all five decoded
    with pytest.raises(UsageError, match="need 69 positions; the model has 68 .*: give max_new_tokens <= 5"):
        child.answer(torch.arange(3), 6)
    monkeypatch.setattr(parent.adapter.config, "max_position_embeddings", 60 + 3)  # no room for one token
    with pytest.raises(UsageError, match="the question leave no position for an answer: give a shorter context or "
                                         "question") as refused:
        child.answer(torch.arange(3), 1)
    assert "max_new_tokens <= 0" not in str(refused.value)


@pytest.mark.parametrize("count", [2.5, 2.0, "2", None, True, torch.tensor(2)])
def test_a_token_count_that_is_not_an_integer_is_refused(parent, no_decoding, count):
    child = parent.fork(parent.keep_all_plan())
    with pytest.raises(UsageError, match=f"max_new_tokens must be an integer >= 1, got {re.escape(repr(count))}"):
        child.answer(torch.arange(3), count)


def test_numpy_integers_are_integers(tiny):
    model = tiny("qwen3_5")
    parent = prefill(model, torch.arange(60) % 97, protected=np.int64(4), chunk_size=np.int32(16))
    assert parent.protected == 4
    answer = parent.fork(parent.keep_all_plan()).answer(torch.arange(3), np.int64(2))
    assert len(answer.tokens) == 2 and answer.tokens == parent.answer(torch.arange(3), 2).tokens


@pytest.mark.parametrize("plan, shown", [(dict, "the class dict"), ({}, "dict {}"), (None, "NoneType None")])
def test_fork_names_a_plan_that_is_not_one(parent, plan, shown):
    with pytest.raises(ArgumentTypeError, match=f"plan must be a KeepPlan .*, got {shown}$"):
        parent.fork(plan)


@pytest.mark.parametrize("ids, shown", [("What?", "str 'What\\?'"), (None, "NoneType None"), (3.5, "float 3.5")])
def test_text_or_nothing_where_token_ids_belong_is_named(parent, ids, shown):
    with pytest.raises(ArgumentTypeError, match=f"question_ids must be token ids .*, got {shown}"):
        parent.answer(ids, 2)
    with pytest.raises(ArgumentTypeError, match=f"context_ids must be token ids .*, got {shown}"):
        prefill(parent.adapter.model, ids)


def test_stop_tokens_and_the_chooser_are_checked(parent):
    with pytest.raises(ArgumentTypeError, match="eos_token_id must be a token id, a list of them or None, got str 'x'"):
        parent.answer(torch.arange(3), 2, eos_token_id="x")
    for negative, shown in ((-5, "int -5"), ([0, -1], r"list \[0, -1\]")):
        with pytest.raises(UsageError, match=rf"eos_token_id must be token ids >= 0 .*, got {shown}"):
            parent.answer(torch.arange(3), 2, eos_token_id=negative)
    with pytest.raises(ArgumentTypeError, match="choose must map a step's logits to a token"):
        parent.answer(torch.arange(3), 2, choose=3)
    first = parent.answer(torch.arange(3), 1).tokens[0]
    assert parent.answer(torch.arange(3), 4, eos_token_id=np.int64(first)).tokens == [first]
    vocab = parent.adapter.config.vocab_size
    for token in (vocab, -1):
        with pytest.raises(UsageError, match=rf"choose returned {token}, not a token id of this model: ids must be "
                                             rf"in \[0, {vocab}\)"):
            parent.answer(torch.arange(3), 4, choose=lambda logits, token=token: token)
    assert parent.answer(torch.arange(3), 1).tokens == [first]  # the failed answers left the parent as it was


@pytest.mark.parametrize("layers, message", [
    (None, r"KeepPlan takes \{attention layer: \[positions per KV head\]\}, got NoneType None"),
    ({3: 5}, "keep plan layer 3: expected a list of kept positions per KV head, got int 5"),
    ({3: ["abc"]}, "keep plan layer 3 head 0: positions must be integers, got str 'abc'"),
])
def test_a_keep_plan_of_other_things_is_named(layers, message):
    with pytest.raises(ArgumentTypeError, match=message):
        KeepPlan(layers)


@pytest.mark.parametrize("n, protected, heads, message", [
    (5, 10, 2, "protected=10 is not allowed: it must be in [0, n - 1] = [0, 4]"),
    (5, 5, 2, "protected=5 is not allowed: it must be in [0, n - 1] = [0, 4]"),
    (0, 0, 2, "n (the context's tokens)"),
    (5, -1, 2, "protected"),
    (5, 1, 0, "num_kv_heads"),
])
def test_a_keep_all_plan_of_an_impossible_context_is_refused_naming_the_value(n, protected, heads, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        KeepPlan.keep_all(n, protected, [1, 3], heads)
    assert KeepPlan.keep_all(5, 4, [1, 3], 2).layers[3][1].tolist() == [4]


@pytest.mark.parametrize("call, shown", [
    (lambda cache, q: cache.logits(q, observer=3), "int 3"),
    (lambda cache, q: cache.observe(q, observer="x"), "str 'x'"),
    (lambda cache, q: cache.observe(q, observer=None), "NoneType None"),
])
def test_an_observer_that_is_not_one_is_named_before_the_model_runs(parent, no_decoding, call, shown):
    with pytest.raises(ArgumentTypeError, match=re.escape("observer must be a ForwardObserver") + ".*got " +
                       re.escape(shown)):
        call(parent, torch.tensor([1, 2]))


def test_a_context_hash_that_is_not_text_is_named_before_the_model_runs(parent, no_decoding):
    with pytest.raises(ArgumentTypeError, match=r"context_hash must be the hash of the context .* got int 3$"):
        parent.answer(torch.tensor([1, 2]), 2, context_hash=3)


def test_a_tokenizer_that_cannot_decode_is_refused_at_the_prefill(tiny, monkeypatch):
    import runtime.session

    monkeypatch.setattr(runtime.session, "forward_chunk", lambda *a, **k: pytest.fail("prefilled a bad tokenizer"))
    with pytest.raises(ArgumentTypeError, match=r"tokenizer must be a tokenizer .* or None, got str 'tok'$"):
        prefill(tiny("qwen3_5"), torch.arange(10), tokenizer="tok")

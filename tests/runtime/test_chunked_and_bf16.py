"""Chunked prefill equals one pass; the runtime and every press work in bfloat16."""

import math

import pytest
import torch

import presses
import runtime.session
from runtime import DEFAULT_PREFILL_CHUNK, EvidenceRequest, prefill
from tests.helpers import FAMILIES_AND_REAL_MODEL, MAMBA2_FAMILIES, REAL_MODEL, token_ids


@pytest.mark.parametrize("family", FAMILIES_AND_REAL_MODEL)
@pytest.mark.parametrize("chunk", [1, 37, 64])
def test_chunked_prefill_equals_one_pass(tiny, family, chunk):
    if family == REAL_MODEL and chunk == 1:
        pytest.skip("one token per pass: 40 s on the real model; chunks of 37 and 64 test the same path")
    model = tiny(family)
    context, question = token_ids(150, 5), token_ids(6, 6)
    request = EvidenceRequest(recurrent_signals=True, window=20)
    whole = prefill(model, context, protected=4, evidence=request)
    chunked = prefill(model, context, protected=4, evidence=request, chunk_size=chunk)
    assert torch.allclose(whole.last_logits, chunked.last_logits, atol=1e-4, rtol=0)
    for layer in whole.adapter.attention_layers:
        assert torch.allclose(whole.kv[layer].keys, chunked.kv[layer].keys, atol=1e-4, rtol=0)
        assert torch.allclose(whole.kv[layer].values, chunked.kv[layer].values, atol=1e-4, rtol=0)
        assert torch.allclose(whole.evidence.window_hidden[layer], chunked.evidence.window_hidden[layer], atol=1e-4)
    for layer, signals in whole.evidence.recurrent_signals.items():
        assert signals.shape == chunked.evidence.recurrent_signals[layer].shape
        # the random model's log-decays reach -30, where one float32 ulp is 2e-6 and deeper layers inherit the
        # earlier layers' reassociation differences: 1e-4 absolute plus 1e-5 relative
        assert torch.allclose(signals, chunked.evidence.recurrent_signals[layer], atol=1e-4, rtol=1e-5)
    assert torch.allclose(whole.logits(question), chunked.logits(question), atol=1e-4, rtol=0)


def test_long_contexts_are_prefilled_in_default_chunks(tiny, monkeypatch):
    model = tiny("qwen3_5")
    context = token_ids(DEFAULT_PREFILL_CHUNK + 50, 9)
    one_pass = prefill(model, context, chunk_size=None)
    passes, forward = [], runtime.session.forward_chunk

    def counted(adapter, state, ids, *rest):
        passes.append(len(ids))
        return forward(adapter, state, ids, *rest)

    monkeypatch.setattr(runtime.session, "forward_chunk", counted)
    default = prefill(model, context)
    assert passes == [DEFAULT_PREFILL_CHUNK, 50]
    assert torch.allclose(one_pass.last_logits, default.last_logits, atol=1e-4, rtol=0)


def test_chunk_size_is_checked(tiny):
    with pytest.raises(ValueError, match="chunk_size=0 must be a positive integer"):
        prefill(tiny("qwen3_5"), token_ids(10, 0), chunk_size=0)


@pytest.fixture
def bf16(tiny):
    used = []

    def get(family):
        used.append(family)
        return tiny(family).to(torch.bfloat16)

    yield get
    for family in used:  # the session-cached models go back to float32 for the other tests
        tiny(family).float()


@pytest.mark.parametrize("family", FAMILIES_AND_REAL_MODEL)
def test_bf16_keep_all_fork_equals_fresh_run(bf16, family):
    """Logits within 0.1, or 4 bf16 ulps at the largest logit's magnitude where that is more, of transformers' own
    bf16 forward: bf16 has 8 mantissa bits, so one ulp is 0.03 at logits of magnitude 4-8 (the tiny models) and
    0.125 at 16-32 (the real model), and the two paths sum in different orders; greedy tokens identical wherever the
    fresh run's top token leads by more than that rounding (a near-tie may flip either way, on either path)."""
    model = bf16(family)
    context, question = token_ids(100, 7), token_ids(8, 8)
    parent = prefill(model, context, protected=4)
    child = parent.fork(parent.keep_all_plan())
    assert parent.kv[parent.adapter.attention_layers[0]].keys.dtype == torch.bfloat16
    fresh = model(torch.cat([context, question])[None]).logits[0, 100:].float()
    ours = child.logits(question).float()
    tolerance = max(0.1, 4 * 2.0 ** (math.floor(math.log2(float(fresh.abs().max()))) - 7))
    assert (ours - fresh).abs().max() <= tolerance
    differ = ours.argmax(-1) != fresh.argmax(-1)
    lead = fresh.max(-1).values - fresh.gather(-1, ours.argmax(-1, keepdim=True))[:, 0]
    assert (lead[differ] <= tolerance).all(), f"greedy tokens differ where the top leads by {lead[differ].tolist()}"
    assert differ.sum() <= 1


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe", *MAMBA2_FAMILIES])
@pytest.mark.parametrize("press_name", ["snapkv", "keydiff", "kvzip", "triattention", "gatesight"])
def test_bf16_every_press_scores_and_compacts_exactly(bf16, family, press_name):
    from presses.calibration import calibrate
    from presses.gatesight import GateSightEstimator

    model = bf16(family)
    adapter = __import__("runtime").adapter_for(model)
    options = {"gatesight": {"estimator": GateSightEstimator.random(adapter)},
               "triattention": {"calibration": calibrate(model, [token_ids(64, 9)], ["random"])},
               "kvzip": {"tokenizer": _ByteTokenizer()}}.get(press_name, {})
    press = presses.get(press_name, **options)
    parent = prefill(model, token_ids(90, 10), protected=4, evidence=press.evidence(adapter))
    selection = presses.Selection(parent, press)
    scores = selection.scores
    assert all(s.shape == (2, 86) and bool(s.float().isfinite().all()) for s in scores.values())
    plan = selection.plan("flat", 0.3)
    child = parent.fork(plan)
    for layer, heads in plan.layers.items():
        kept = torch.cat([torch.arange(4), heads[0]])
        assert torch.equal(child.kv[layer].keys[0], parent.kv[layer].keys[0, kept])  # a copy, bit for bit
    assert child.answer(token_ids(3, 11), 2).tokens


class _ByteTokenizer:
    """Maps text to ids below the tiny vocabulary (97): enough for KVzip's repeat prompt."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 97 for c in text]}


def test_bfloat16_signals_halve_the_evidence(tiny):
    from runtime import EvidenceRequest as Request

    model = tiny("qwen3_5")
    wide = prefill(model, token_ids(60, 12), evidence=Request(recurrent_signals=True))
    bf16_signals = presses.get("gatesight", signal_dtype="bfloat16").evidence(None)
    narrow = prefill(model, token_ids(60, 12), evidence=bf16_signals)
    for layer, signals in wide.evidence.recurrent_signals.items():
        assert signals.dtype == torch.float32 and narrow.evidence.recurrent_signals[layer].dtype == torch.bfloat16
        assert narrow.evidence.recurrent_signals[layer].nbytes * 2 == signals.nbytes
        assert torch.allclose(narrow.evidence.recurrent_signals[layer].float(), signals, rtol=1e-2, atol=1e-2)
    # a request for float32 signals wins over one for bfloat16; no preference defers to the other
    assert (Request(recurrent_signals=True, signal_dtype=torch.bfloat16)
            | Request(signal_dtype=torch.float32)).signal_dtype == torch.float32
    merged = Request(recurrent_signals=True, signal_dtype=torch.bfloat16) | Request(window=4)
    assert merged.signal_dtype == torch.bfloat16

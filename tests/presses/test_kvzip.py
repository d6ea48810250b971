"""KVzip's reconstruction pass at its cost: each layer's scores come out of the pass's own attention
(:func:`runtime.explicit_attention.attend_with_key_max`) with no second QK product, the kept sets are those of the
observer before, which recomputed the restricted attention and which the vLLM engine's replay still runs, and the pass
stops after the last attention layer."""

import pytest
import torch

import presses
import runtime.explicit_attention
from presses import kvzip
from runtime import prefill
from runtime.explicit_attention import max_attention
from testing.offline import ByteTokenizer
from testing.tiny_models import MODELS
from tests.helpers import token_ids

PLANS = [(allocator, p) for allocator in ("flat", "global") for p in (0.1, 0.3, 0.5)]


class _ObserverBefore:
    """The observer as it was before the pass handed it its maxima (``presses/kvzip.py`` at d7c0458), kept as the
    reference: a second QK product over ``[protected | chunk | own keys]`` after the pass's attention."""

    wants_recurrent_signals = False

    def __init__(self, context, start, end, scores):
        self.context, self.start, self.end, self.scores = context, start, end, scores
        self.last_layer = max(context.adapter.attention_layers)

    def on_attention(self, layer, hidden, query, gate, keys, values, output):
        context, g = self.context, self.context.adapter.geometry
        stored = context.kv[layer].keys
        restricted = torch.cat([stored[:, : context.protected], stored[:, self.start : self.end], keys], dim=1)
        best = max_attention(query, restricted, context.adapter.attention_module(layer).scaling,
                             causal_tail=query.shape[1])
        chunk = best[:, context.protected : context.protected + self.end - self.start]  # [H, c]
        chunk = chunk.view(g.num_kv_heads, g.group_size, -1).amax(1)
        body = slice(self.start - context.protected, self.end - context.protected)
        self.scores[layer][:, body] = chunk.float()


class _Replayed(kvzip._ReconstructionAttention):
    """The observer as the vLLM replay drives it (``serving.served_context.Passes``): no maxima handed to it."""

    def __init__(self, *args):
        super().__init__(*args)
        del self.restricted_keys


def _score(parent, chunk_size=64):
    """KVzip's scores of ``parent`` and the kept positions of :data:`PLANS`."""
    selection = presses.Selection(parent, presses.get("kvzip", tokenizer=ByteTokenizer(), chunk_size=chunk_size))
    return selection.scores, {plan: selection.plan(*plan).layers for plan in PLANS}


def _same_kept(kept, reference):
    for plan in PLANS:
        for layer, heads in reference[plan].items():
            assert all(torch.equal(a, b) for a, b in zip(kept[plan][layer], heads, strict=True)), (plan, layer)


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3", "bamba", "falcon_h1"])
def test_kept_sets_equal_those_of_the_observer_before(tiny, family, monkeypatch):
    parent = prefill(tiny(family), token_ids(160, 4), protected=5)
    scores, kept = _score(parent)  # three reconstruction passes
    monkeypatch.setattr(kvzip, "_ReconstructionAttention", _ObserverBefore)
    scores_before, kept_before = _score(parent)
    _same_kept(kept, kept_before)
    # the first attention layer sees the same queries: the same softmax over the same logits, bit for bit; later
    # layers see the pass's attention output through an explicit part merged with the fused kernel's (float32 ulps)
    first = min(scores_before)
    assert torch.equal(scores[first], scores_before[first])
    for layer, before in scores_before.items():
        torch.testing.assert_close(scores[layer], before, rtol=1e-5, atol=0)


def test_the_pass_runs_no_second_qk_product(tiny, monkeypatch):
    parent = prefill(tiny("qwen3_5"), token_ids(160, 4), protected=5)
    scores, kept = _score(parent)

    def refuse(*args, **kwargs):
        raise AssertionError("the reconstruction pass recomputed the restricted attention")

    for module in (kvzip, runtime.explicit_attention):
        monkeypatch.setattr(module, "max_attention", refuse, raising=False)
    monkeypatch.setattr(runtime.explicit_attention, "attention_probs", refuse)
    scores_again, kept_again = _score(parent)
    assert all(torch.equal(scores_again[layer], s) for layer, s in scores.items())
    _same_kept(kept_again, kept)


@pytest.mark.parametrize("family", ["qwen3_5", "falcon_h1"])
def test_the_replay_without_maxima_scores_as_the_observer_before(tiny, family, monkeypatch):
    """Where the pass ran in the engine and only its queries and keys come back, the observer computes the maxima
    itself: exactly as before."""
    parent = prefill(tiny(family), token_ids(160, 4), protected=5)
    monkeypatch.setattr(kvzip, "_ReconstructionAttention", _Replayed)
    replayed, _ = _score(parent)
    monkeypatch.setattr(kvzip, "_ReconstructionAttention", _ObserverBefore)
    before, _ = _score(parent)
    assert all(torch.equal(replayed[layer], s) for layer, s in before.items())


def test_the_pass_stops_after_the_last_attention_layer_and_scores_alike(monkeypatch):
    """On a hybrid whose last layers are recurrent (GDN, GDN, GDN, attention, GDN, GDN), each reconstruction pass
    runs layers 0-3 and no output head; run through every layer and the head instead, its scores are the same."""
    parent = prefill(MODELS["qwen3_5"](num_hidden_layers=6), token_ids(120, 2), protected=4)
    adapter = parent.adapter
    assert adapter.attention_layers == (3,) and len(adapter.layer_kinds) == 6
    ran = []
    norm, head = adapter.input_norm, adapter.logits
    monkeypatch.setattr(adapter, "input_norm", lambda layer, hidden: ran.append(layer) or norm(layer, hidden))
    monkeypatch.setattr(adapter, "logits", lambda hidden: ran.append("head") or head(hidden))
    stopped, kept = _score(parent, chunk_size=50)
    assert ran == [0, 1, 2, 3] * 3  # three chunks of the 116-token body

    class Unstopped(kvzip._ReconstructionAttention):
        def __init__(self, *args):
            super().__init__(*args)
            self.last_layer = None

    monkeypatch.setattr(kvzip, "_ReconstructionAttention", Unstopped)
    ran.clear()
    full, kept_full = _score(parent, chunk_size=50)
    assert ran == [0, 1, 2, 3, 4, 5, "head"] * 3
    assert torch.equal(stopped[3], full[3])
    assert all(torch.equal(a, b) for plan in PLANS for a, b in zip(kept[plan][3], kept_full[plan][3], strict=True))

"""KVzip's reconstruction pass at its cost: the observer's kernel and the pass's stop after the last attention layer
leave every score, hence every kept set, exactly as before."""

import pytest
import torch

import presses
from presses import kvzip
from runtime import prefill
from testing.offline import ByteTokenizer
from testing.tiny_models import MODELS
from tests.helpers import token_ids
from tests.runtime.test_max_attention import max_attention_before

PLANS = [(allocator, p) for allocator in ("flat", "global") for p in (0.1, 0.3, 0.5)]


def _score(parent, chunk_size=64):
    """KVzip's scores of ``parent`` and the kept positions of :data:`PLANS`."""
    selection = presses.Selection(parent, presses.get("kvzip", tokenizer=ByteTokenizer(), chunk_size=chunk_size))
    return selection.scores, {plan: selection.plan(*plan).layers for plan in PLANS}


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3", "bamba", "falcon_h1"])
def test_scores_and_kept_sets_equal_those_of_the_previous_kernel(tiny, family, monkeypatch):
    parent = prefill(tiny(family), token_ids(160, 4), protected=5)
    scores, kept = _score(parent)  # three reconstruction passes
    monkeypatch.setattr(kvzip, "max_attention", max_attention_before)
    scores_before, kept_before = _score(parent)
    assert all(torch.equal(scores[layer], scores_before[layer]) for layer in scores_before)
    for plan in PLANS:
        for layer, heads in kept_before[plan].items():
            assert all(torch.equal(a, b) for a, b in zip(kept[plan][layer], heads, strict=True)), (plan, layer)


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

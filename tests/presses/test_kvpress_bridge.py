"""Every kvpress ScorerPress through the bridge: it scores and forks on every tiny model, or it is refused with
its reason when built or checked; on the dense models its scores equal kvpress's own (its forward hooks)."""

import re

import kvpress
import pytest
import torch
from transformers import DynamicCache

import presses
from presses.kvpress_adapter import ALL_TOKENS, KvpressScorer
from runtime import EvidenceRequest, adapter_for, prefill
from tests.helpers import FAMILIES, token_ids

SCORERS = sorted(name for name in dir(kvpress) if isinstance(getattr(kvpress, name), type)
                 and issubclass(getattr(kvpress, name), kvpress.ScorerPress)
                 and getattr(kvpress, name) is not kvpress.ScorerPress)


def _build(name, **options):
    """The press with its defaults (wrappers wrap a Knorm press); Compactor's blending, which defaults to the
    compression ratio, is fixed so that its scores do not depend on the ratio."""
    cls = getattr(kvpress, name)
    if name == "CompactorPress":
        options["blending"] = 0.5
    try:
        return cls(**options)
    except TypeError:
        return cls(press=kvpress.KnormPress(**options))


def test_every_scorer_press_is_discovered():
    assert len(SCORERS) >= 19 and "SnapKVPress" in SCORERS and "ObservedAttentionPress" in SCORERS


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", SCORERS)
def test_scores_and_forks_or_is_refused_with_its_reason(tiny, family, name):
    model = tiny(family)
    try:
        press = KvpressScorer(press=_build(name))
        press.check(adapter_for(model))
    except ValueError as reason:
        assert name in str(reason) and ("cannot run here: it" in str(reason) or "partial RoPE" in str(reason))
        return
    parent = prefill(model, token_ids(300), protected=4, evidence=press.evidence(None))
    selection = presses.Selection(parent, press)
    assert all(s.shape == (parent.adapter.geometry.num_kv_heads, 296) for s in selection.scores.values())
    child = selection.fork("flat", 0.3)
    assert child.answer(token_ids(3, 1), 2).tokens


@pytest.mark.parametrize("name", [name for name in SCORERS if "press" in __import__("inspect").signature(
    getattr(kvpress, name)).parameters])
def test_a_scorer_that_wraps_another_press_says_so_by_name(model_dir, tmp_path, capsys, no_model_load, name):
    """kvpress:CriticalKVPress said "missing 1 required positional argument: 'press'", which no option gives."""
    from tests.helpers import run_cli

    message = f"kvpress:{name} wraps another press (its argument 'press'), which options here cannot give"
    with pytest.raises(ValueError, match=re.escape(message)):
        presses.get(f"kvpress:{name}")
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--press", f"kvpress:{name}", "--alloc", "flat",
                        "--out", tmp_path / "out")
    assert code == 2 and message in err and "as the allocators adakv, perlayer and pyramid" in err, err


def _kvpress_reference(model, name, ids):
    """Scores from kvpress's own forward hooks during a transformers prefill, per layer ``[H_kv, n]``."""
    press = _build(name, compression_ratio=0.5)
    if name == "RandomPress":
        press.seed = 0
    captured, score = {}, press.score

    def spy(module, hidden_states, keys, values, attentions, kwargs):
        captured[module.layer_idx] = score(module, hidden_states, keys, values, attentions, kwargs)
        return captured[module.layer_idx]

    press.score = spy
    implementation = model.config._attn_implementation
    model.config._attn_implementation = "eager"  # kvpress's requirement for presses that read attention weights
    torch.manual_seed(0)
    try:
        with torch.no_grad(), press(model):
            model(ids[None], past_key_values=DynamicCache(config=model.config))
    finally:
        model.config._attn_implementation = implementation
    return {layer: s[0].float() for layer, s in captured.items()}


def _builds(name) -> bool:
    try:
        KvpressScorer(press=_build(name))
        return True
    except ValueError:
        return False


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("name", [name for name in SCORERS if _builds(name)])  # the refused ones: test above
def test_scores_equal_kvpress_on_dense_models(tiny, family, name):
    model = tiny(family)
    press = KvpressScorer(press=_build(name))
    ids = token_ids(300, 2)
    parent = prefill(model, ids, protected=0, evidence=press.evidence(None))
    if name == "RandomPress":  # random scores: both sides draw from the same seed
        press.press.seed = 0
    torch.manual_seed(0)  # sketching presses (Leverage, Compactor) draw random projections layer by layer
    ours = press.score(parent)
    reference = _kvpress_reference(model, name, ids)
    assert sorted(reference) == sorted(ours)
    for layer in ours:
        assert torch.allclose(ours[layer], reference[layer], atol=1e-5, rtol=1e-5), (
            layer, (ours[layer] - reference[layer]).abs().max())


def test_qwen35_presses_see_the_models_own_queries(tiny):
    """kvpress's query helper, handed the bridge's view of a gated partial-RoPE attention, returns the runtime's
    post-RoPE queries (the ones whose attention the runtime reproduces exactly) for any slice of the context."""
    from kvpress.utils import get_prerope_query_states

    from presses.kvpress_adapter import _QueryView

    model = tiny("qwen3_5")
    adapter = adapter_for(model)
    parent = prefill(model, token_ids(120, 3), evidence=EvidenceRequest(window=ALL_TOKENS))
    layer = adapter.attention_layers[0]
    hidden = parent.evidence.window_hidden[layer][None]
    cos, sin = model.model.rotary_emb(hidden, torch.arange(120)[None])
    queries = adapter.queries(layer, hidden, cos[0], sin[0])  # [H, n, d]
    view = _QueryView(adapter.attention_module(layer), hidden, queries.transpose(0, 1).reshape(1, 120, -1))
    assert torch.equal(get_prerope_query_states(view, hidden[:, -16:])[0], queries[:, -16:])
    assert torch.equal(get_prerope_query_states(view, hidden[:, 30:70])[0], queries[:, 30:70])
    assert view.k_proj is adapter.attention_module(layer).k_proj  # everything else is the module itself

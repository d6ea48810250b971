"""Each scorer against a brute-force or kvpress reference; the parent is unchanged by scoring."""

import pytest
import torch
import torch.nn.functional as F
from kvpress import KeyDiffPress as KvpressKeyDiff
from kvpress import KnormPress

import allocators
import presses
from allocators.integerize import round_half_up
from presses.calibration import Calibration, band_frequencies, calibrate, query_bands
from presses.gatesight import GateSightEstimator, GateSightPress, build_features, feature_names
from presses.kvpress_adapter import KvpressScorer
from presses.triattention import TriAttentionPress, trig_preference
from runtime import EvidenceRequest, prefill
from runtime.adapters import apply_rope
from testing.offline import REGISTERED_PRESSES, ByteTokenizer, offline_allocator, offline_press
from testing.tiny_models import MODELS
from tests.helpers import HYBRID_FAMILIES, token_ids


def _eager(family):
    model = MODELS[family]()
    model.set_attn_implementation("eager")
    return model


def _parent(model, n=160, protected=5, press=None, tokenizer=None):
    request = press.evidence(None) if press is not None else EvidenceRequest()
    return prefill(model, token_ids(n, 0), protected=protected, evidence=request, tokenizer=tokenizer)


def test_snapkv_matches_brute_force_attention():
    model = _eager("qwen3_5")
    press = presses.get("snapkv")
    parent = _parent(model, press=press)
    attentions = model(parent.context_ids[None], output_attentions=True).attentions
    scores = press.score(parent)
    n, w, g = parent.n, press.window, parent.adapter.geometry
    for k, layer in enumerate(parent.adapter.attention_layers):
        votes = attentions[k][0, :, n - w :, : n - w].sum(1)  # [H, n - w] from the model's own eager attention
        votes = votes.view(g.num_kv_heads, g.group_size, -1).mean(1)
        pooled = F.max_pool1d(votes[None], 7, stride=1, padding=3)[0]
        assert torch.allclose(scores[layer][:, : n - w - parent.protected], pooled[:, parent.protected :], atol=1e-5)
        assert torch.allclose(scores[layer][:, -w:], pooled.max().expand(g.num_kv_heads, w), atol=1e-5)


def test_keydiff_normalized_equals_kvpress(tiny):
    parent = _parent(tiny("qwen3_5"))
    ours = presses.get("keydiff", normalized_anchor=True).score(parent)
    plain = presses.get("keydiff").score(parent)
    for layer in parent.adapter.attention_layers:
        body = parent.kv[layer].keys[None, :, parent.protected :]
        reference = KvpressKeyDiff().score(None, None, body, None, None, {})[0]
        assert torch.allclose(ours[layer], reference, atol=1e-6)
        anchor = body[0].mean(1, keepdim=True)
        assert torch.allclose(plain[layer], -F.cosine_similarity(body[0], anchor, dim=-1), atol=1e-6)


def test_kvpress_adapter_runs_kvpress_scorers_on_a_hybrid(tiny):
    model = tiny("qwen3_5")
    knorm = KvpressScorer(press=KnormPress())
    parent = _parent(model, press=knorm)
    knorm_scores = knorm.score(parent)
    keydiff_scores = KvpressScorer(press=KvpressKeyDiff()).score(parent)
    for layer in parent.adapter.attention_layers:
        keys = parent.kv[layer].keys
        assert torch.allclose(knorm_scores[layer], -keys[:, parent.protected :].norm(dim=-1), atol=1e-6)
        anchor = F.normalize(keys, dim=-1).mean(1, keepdim=True)
        expected = -F.cosine_similarity(keys, anchor, dim=-1)[:, parent.protected :]
        assert torch.allclose(keydiff_scores[layer], expected, atol=1e-6)
    with pytest.raises(ValueError, match="wraps a kvpress ScorerPress"):
        KvpressScorer(press=object()).check(parent.adapter)


def test_triattention_trig_form_is_the_centre_query_logit(tiny):
    parent = _parent(tiny("qwen3_5"))
    adapter, g = parent.adapter, parent.adapter.geometry
    layer = adapter.attention_layers[0]
    centre_real = torch.randn(g.num_heads, g.head_dim, generator=torch.Generator().manual_seed(0))
    centre = query_bands(centre_real, g.rotary_dim)
    keys = parent.kv[layer].keys.repeat_interleave(g.group_size, 0)  # post-RoPE
    omega = band_frequencies(adapter)
    for offset in (1, 5, 64, 300):
        query_position = torch.tensor([parent.n + offset])
        trig = trig_preference(centre, query_bands(keys, g.rotary_dim), omega, query_position)
        cos, sin = adapter.rope(keys, query_position)
        rotated = apply_rope(centre_real[:, None], cos, sin)  # the centre query at its future position
        direct = (rotated * keys).sum(-1)
        # both sides rotate in float32 (the model computes its RoPE angles in float32): ~1e-5 relative
        assert torch.allclose(trig, direct, rtol=1e-4, atol=2e-4)


def test_triattention_uses_stored_calibration(tiny, tmp_path):
    model = tiny("qwen3_5")
    calibration = calibrate(model, [token_ids(200, 1), token_ids(100, 2)], ["random ids"])
    calibration.save(tmp_path)
    loaded = Calibration.load(tmp_path)
    assert loaded.tokens == 300 and loaded.gate_weights == pytest.approx(calibration.gate_weights)
    parent = _parent(model)
    a = TriAttentionPress(calibration=calibration).score(parent)
    b = TriAttentionPress(calibration=loaded).score(parent)
    for layer in a:
        assert torch.allclose(a[layer], b[layer])
        assert a[layer].shape == (2, parent.n - parent.protected)
    with pytest.raises(FileNotFoundError, match="bench calibrate"):
        Calibration.load(tmp_path / "missing")


def test_kvzip_single_chunk_equals_full_attention_and_leaves_parent_unchanged():
    model = _eager("qwen3")
    press = presses.get("kvzip", tokenizer=ByteTokenizer())
    parent = _parent(model, n=120)
    question = token_ids(6, 3)
    before = parent.answer(question, 5).tokens
    scores = press.score(parent)
    assert parent.answer(question, 5).tokens == before
    # one chunk: the restricted key set is the whole context, so the scores are the model's own attention
    prompt = torch.tensor(ByteTokenizer()(press.prompt)["input_ids"] + ByteTokenizer()(press.suffix)["input_ids"])
    repeat = torch.cat([prompt, parent.context_ids[parent.protected :]])
    attentions = model(torch.cat([parent.context_ids, repeat])[None], output_attentions=True).attentions
    g = parent.adapter.geometry
    for k, layer in enumerate(parent.adapter.attention_layers):
        rows = attentions[k][0, :, parent.n :, parent.protected : parent.n].amax(1)
        expected = rows.view(g.num_kv_heads, g.group_size, -1).amax(1)
        assert torch.allclose(scores[layer], expected, atol=1e-5)


def test_kvzip_leaves_hybrid_gdn_state_unchanged(tiny):
    parent = _parent(tiny("qwen3_5"), n=150)
    states = {i: s.recurrent.clone() for i, s in parent.recurrent_states.items()}
    before = parent.answer(token_ids(7, 5), 6).tokens
    presses.get("kvzip", tokenizer=ByteTokenizer(), chunk_size=64).score(parent)
    assert parent.answer(token_ids(7, 5), 6).tokens == before
    assert all(torch.equal(parent.recurrent_states[i].recurrent, s) for i, s in states.items())


def test_gatesight_feature_layout(tiny):
    parent = _parent(tiny("qwen3_5", ), n=50, press=GateSightPress())
    adapter = parent.adapter
    layer = adapter.attention_layers[1]  # layer 7: preceded by GDN layers 0, 1, 2, 4, 5, 6
    names = feature_names(adapter, layer)
    estimator = GateSightEstimator.random(adapter)
    assert estimator.gdn_layers[layer] == [0, 1, 2, 4, 5, 6]
    positions = torch.tensor([9, 30])
    features = build_features(parent.evidence.recurrent_signals, estimator.gdn_layers[layer], parent.n, positions)
    assert features.shape == (2, len(names)) == (2, 6 * 4 * 3 + 3)
    signals = parent.evidence.recurrent_signals
    for column, name in enumerate(names[:-3]):
        gdn, head, signal = name.split(".")
        expected = signals[int(gdn[3:])][positions, int(head[1:]), ("beta", "g", "vnorm").index(signal)]
        assert torch.equal(features[:, column], expected)
    i = positions.float() + 1
    assert torch.allclose(features[:, -3:], torch.stack([i / 50, (50 - i) / 50, torch.log1p(50 - i) / torch.log1p(
        torch.tensor(50.0))], -1))


def test_gatesight_artifact_reloads_to_identical_scores(tiny, tmp_path):
    model = tiny("qwen3_5")
    estimator = GateSightEstimator.random(model and __import__("runtime").adapter_for(model), seed=4)
    parent = _parent(model, press=GateSightPress())
    scores = GateSightPress(estimator=estimator).score(parent)
    estimator.save(tmp_path / "gatesight")
    reloaded = GateSightPress(estimator=GateSightEstimator.load(tmp_path / "gatesight")).score(parent)
    for layer in scores:
        assert scores[layer].shape == (2, parent.n - parent.protected)
        assert torch.equal(scores[layer], reloaded[layer])
        assert torch.all((scores[layer] > 0) & (scores[layer] < 1))


def test_gatesight_compares_layers_exactly_when_its_estimator_is_on_one_scale(tiny, tmp_path):
    """comparable_scale is the estimator's answer (the class's stays False, so registries list only the presses
    whose every instance compares layers); the scores are the estimator's predictions on its scale: the sigmoid of
    the raw output per head, its exponential (a share of the document's largest utility) on one scale; an
    estimator saved before estimators recorded their scale is a per-head one."""
    import json

    from presses.selection import check_pair

    model = tiny("qwen3_5")
    adapter = __import__("runtime").adapter_for(model)
    head = GateSightEstimator.random(adapter, seed=2)
    one = GateSightEstimator(head.window, head.layers, head.gdn_layers, {"scale": "one"})
    assert GateSightPress.comparable_scale is False and "gatesight" not in [
        name for name, cls in presses.PRESSES.items() if cls.comparable_scale]
    assert not GateSightPress().comparable_scale and not GateSightPress(estimator=head).comparable_scale
    assert GateSightPress(estimator=one).comparable_scale
    parent = _parent(model, press=GateSightPress())
    per_head, shared = GateSightPress(estimator=head).score(parent), GateSightPress(estimator=one).score(parent)
    positions = torch.arange(parent.protected, parent.n)
    for layer in adapter.attention_layers:
        raw = head.logits(layer, build_features(parent.evidence.recurrent_signals, head.gdn_layers[layer], parent.n,
                                                positions))
        assert torch.equal(per_head[layer], torch.sigmoid(raw)) and torch.equal(shared[layer], torch.exp(raw))
    one.save(tmp_path / "one")
    assert GateSightPress(estimator=str(tmp_path / "one")).comparable_scale
    config = json.loads((tmp_path / "one" / "gatesight.json").read_text())
    del config["meta"]["scale"]  # as estimators were saved before they recorded it
    (tmp_path / "one" / "gatesight.json").write_text(json.dumps(config))
    assert GateSightEstimator.load(tmp_path / "one").scale == "head"
    check_pair(GateSightPress(estimator=one), allocators.get("global"))
    for press, has in ((GateSightPress(), "none"), (GateSightPress(estimator=head), "one trained on scale 'head'")):
        with pytest.raises(ValueError) as refused:
            check_pair(press, allocators.get("global"))
        assert f"(it has {has}): `bench train --scale one`" in str(refused.value)


def test_gatesight_refuses_models_it_cannot_run_on(tiny):
    with pytest.raises(ValueError, match="has no GDN layers"):
        GateSightPress().check(_parent(tiny("qwen3")).adapter)
    with pytest.raises(ValueError, match="bench train"):
        GateSightPress().check(_parent(tiny("qwen3_5")).adapter)


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
@pytest.mark.parametrize("press_name", REGISTERED_PRESSES)
@pytest.mark.parametrize("allocator_name", allocators.available())
def test_any_press_with_any_allocator(tiny, family, press_name, allocator_name):
    model = tiny(family)
    adapter = __import__("runtime").adapter_for(model)
    press = offline_press(press_name, model)
    parent = _parent(model, press=press)
    allocator = offline_allocator(allocator_name, len(adapter.attention_layers))
    # for the allocators that read them (others refuse them: they would be ignored)
    weights = {layer: 1.0 + layer for layer in adapter.attention_layers} if allocator.needs_layer_weights else None
    if allocator.compares_layers and not press.comparable_scale:
        with pytest.raises(ValueError, match="scores each layer on a scale of its own"):
            presses.compress(parent, press, allocator, keep_fraction=0.3, layer_weights=weights)
        return
    if allocator.needs_head_shares:  # a tiny model has no directory to read them from: given to the selection
        selection = presses.Selection(parent, press)
        selection.head_shares = {layer: [1.0, 3.0] for layer in adapter.attention_layers}
        child = selection.fork(allocator, 0.3)
    else:
        child = presses.compress(parent, press, allocator, compression_ratio=0.7, layer_weights=weights)
    body = parent.n - parent.protected
    kept = sum(length - parent.protected for kv in child.kv.values() for length in kv.lengths())
    assert kept == len(adapter.attention_layers) * 2 * round_half_up(0.3 * body)
    assert child.answer(token_ids(4, 1), 3).tokens


def test_registry_and_ratio_errors(tiny):
    with pytest.raises(ValueError, match="unknown press 'nope'; available: gatesight, snapkv"):
        presses.get("nope")
    parent = _parent(tiny("qwen3_5"))
    with pytest.raises(ValueError, match="exactly one of keep_fraction"):
        presses.compress(parent, "keydiff", "flat")
    with pytest.raises(ValueError, match="outside"):
        presses.compress(parent, "keydiff", "flat", keep_fraction=1.2)
    assert allocators.available() == ["flat", "gate", "pyramid", "global", "adakv", "perlayer", "head_shares"]


@pytest.mark.parametrize("options,message", [
    ({"chunk_size": 0}, r"chunk_size=0: expected an integer >= 1"),
    ({"chunk_size": -5}, r"chunk_size=-5: expected an integer >= 1"),
    ({"chunk_size": 2.5}, r"kvzip option chunk_size=2.5: expected an integer"),
    ({"overlap": -1}, r"overlap=-1: expected an integer >= 0"),
])
def test_kvzip_options_outside_their_range_are_refused_when_built(options, message):
    with pytest.raises(ValueError, match=message):
        presses.get("kvzip", **options)

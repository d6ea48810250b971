"""The kvpress bridge's prefill records of the context's layer inputs only the rows its scorer reads (none for the
key-only scorers, SnapKV's window, TOVA's last token, every row for the others): on every tiny family, every scorer
the bridge admits scores bit for bit as it does from every row, and the evidence holds exactly those rows. A claim
of one row fewer changes the scores; a prefill that recorded fewer is refused; a subclass that overrides the
scoring reads every row."""

from dataclasses import dataclass

import kvpress
import pytest
import torch

from presses import kvpress_adapter
from presses.kvpress_adapter import ALL_TOKENS, FULL_ROPE_ONLY, KvpressScorer, rows_read
from runtime import EvidenceRequest, adapter_for, prefill
from runtime.errors import UsageError
from tests.helpers import FAMILIES, token_ids
from tests.presses.test_kvpress_bridge import SCORERS, _build, _builds

N, PROTECTED = 300, 4
ROWS = {"CURPress": 0, "KeyDiffPress": 0, "KnormPress": 0, "LagKVPress": 0, "RandomPress": 0,
        "SnapKVPress": 64, "PyramidKVPress": 64, "TOVAPress": 1}
"""The rows each scorer reads, from kvpress 0.5.5's source (its default ``window_size`` 64); every other: all N."""


ADMITTED = [name for name in SCORERS if _builds(name)]


def _scores(press, parent):
    torch.manual_seed(0)  # RandomPress and the sketching presses (Leverage, Compactor) draw from the global generator
    return press.score(parent)


def _prefill(model, window):
    return prefill(model, token_ids(N), protected=PROTECTED, evidence=EvidenceRequest(window=window))


def test_the_bridge_admits_the_scorers_whose_rows_are_claimed():
    assert set(ROWS) <= set(ADMITTED) and set(ADMITTED) - set(ROWS)


@pytest.mark.parametrize("family", FAMILIES)
def test_scores_from_the_rows_read_equal_scores_from_every_row(tiny, family):
    model = tiny(family)
    adapter = adapter_for(model)
    every_row = _prefill(model, ALL_TOKENS)
    row_bytes = adapter.config.hidden_size * torch.finfo(adapter.dtype).bits // 8
    parents, scored = {}, []
    for name in ADMITTED:
        press = KvpressScorer(press=_build(name))
        try:
            press.check(adapter)
        except UsageError:
            assert name in FULL_ROPE_ONLY and adapter.geometry.rotary_dim < adapter.geometry.head_dim
            continue
        window = press.evidence(adapter).window
        assert min(window, N) == ROWS.get(name, N), name
        if window not in parents:
            parents[window] = _prefill(model, window)
        parent = parents[window]
        recorded = parent.evidence.window_hidden
        held = sum(t.untyped_storage().nbytes() for t in recorded.values())
        assert held == len(adapter.attention_layers) * ROWS.get(name, N) * row_bytes, name
        ours, reference = _scores(press, parent), _scores(press, every_row)
        assert sorted(ours) == sorted(reference) == list(adapter.attention_layers)
        for layer in ours:
            assert torch.equal(ours[layer], reference[layer]), (name, layer)
        scored.append(name)
    assert set(ROWS) <= set(scored)


@pytest.mark.parametrize(("family", "name"), [(family, name) for family in ("qwen3", "llama", "qwen3_5")
                                               for name in ("SnapKVPress", "PyramidKVPress", "TOVAPress")
                                               if (family, name) != ("qwen3_5", "TOVAPress")])
def test_one_row_fewer_than_read_changes_the_scores(tiny, monkeypatch, family, name):
    """The equality above fails if a scorer's row count is claimed one too small: its first read row is then a zero
    row. (PyramidKVPress scores with SnapKV's entry.)"""
    model = tiny(family)
    press = KvpressScorer(press=getattr(kvpress, name)())
    entry = "TOVAPress" if name == "TOVAPress" else "SnapKVPress"
    methods, _ = kvpress_adapter.ROWS_READ[entry]
    monkeypatch.setitem(kvpress_adapter.ROWS_READ, entry, (methods, ROWS[name] - 1))
    assert press.evidence(None).window == ROWS[name] - 1
    ours, reference = _scores(press, _prefill(model, ROWS[name] - 1)), _scores(press, _prefill(model, ALL_TOKENS))
    assert any(not torch.equal(ours[layer], reference[layer]) for layer in ours)


def test_tova_claimed_to_read_no_row_fails_on_a_gated_attention(tiny, monkeypatch):
    """On Qwen3.5 a scorer said to read no row gets no query view, and kvpress cannot split its gated ``q_proj``."""
    monkeypatch.setitem(kvpress_adapter.ROWS_READ, "TOVAPress", (("score",), 0))
    with pytest.raises(RuntimeError):
        _scores(KvpressScorer(press=kvpress.TOVAPress()), _prefill(tiny("qwen3_5"), 0))


@pytest.mark.parametrize(("name", "recorded"), [("SnapKVPress", 63), ("TOVAPress", 0)])
def test_a_prefill_with_fewer_rows_than_read_is_refused(tiny, name, recorded):
    press = KvpressScorer(press=getattr(kvpress, name)())
    parent = _prefill(tiny("qwen3"), recorded)
    with pytest.raises(UsageError, match=rf"reads the layer inputs of the last {ROWS[name]} of the {N} context "
                                         rf"tokens; the prefill recorded {recorded}: prefill with evidence="):
        press.score(parent)


@dataclass
class _InheritedSnapKV(kvpress.SnapKVPress):
    """SnapKV's scoring as it is: its window."""


@dataclass
class _FirstRowSnapKV(kvpress.SnapKVPress):
    """Reads the first layer input as well: every row."""

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return super().score(module, hidden_states, keys, values, attentions, kwargs) + hidden_states[0, 0, 0]


@dataclass
class _OwnWindowSnapKV(kvpress.SnapKVPress):
    """SnapKV's score around a window attention of its own: every row."""

    @staticmethod
    def compute_window_attention(module, hidden_states, keys, window_size, position_embeddings):
        return kvpress.SnapKVPress.compute_window_attention(module, hidden_states, keys, window_size + 1,
                                                            position_embeddings)[..., 1:]


@dataclass
class _NormOfFirstRow(kvpress.KnormPress):
    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return super().score(module, hidden_states, keys, values, attentions, kwargs) * hidden_states[0, 0].norm()


def test_only_the_listed_scoring_methods_read_fewer_rows():
    assert rows_read(_InheritedSnapKV(window_size=16)) == 16
    assert rows_read(kvpress.PyramidKVPress(window_size=32)) == 32
    assert rows_read(kvpress.SnapKVPress(window_size=0)) == ALL_TOKENS  # kvpress's hidden_states[:, -0:]: all
    for press in (_FirstRowSnapKV(), _OwnWindowSnapKV(), _NormOfFirstRow(), kvpress.ObservedAttentionPress(),
                  kvpress.ExpectedAttentionPress()):
        assert rows_read(press) == ALL_TOKENS, type(press).__name__
    patched = kvpress.KnormPress()
    patched.score = lambda *args: _NormOfFirstRow.score(patched, *args)
    assert rows_read(patched) == ALL_TOKENS


def test_an_inherited_window_scores_as_from_every_row(tiny):
    model = tiny("qwen3_5")
    press = KvpressScorer(press=_InheritedSnapKV(window_size=16))
    parent = _prefill(model, press.evidence(None).window)
    assert {t.shape[0] for t in parent.evidence.window_hidden.values()} == {16}
    ours, reference = _scores(press, parent), _scores(press, _prefill(model, ALL_TOKENS))
    assert all(torch.equal(ours[layer], reference[layer]) for layer in ours)

"""``runtime.explicit_attention.attend_with_key_max``: its output is :func:`attend`'s, and each key of the restricted
set ``R`` gets its largest probability under a softmax over ``R`` alone, the brute force's (the full softmax restricted
to ``R`` and renormalised); the forward hands those maxima to an observer that declares ``restricted_keys``."""

import pytest
import torch

from runtime import kv, prefill
from runtime.explicit_attention import attend_with_key_max, attention_probs, max_attention
from runtime.forward import SequenceState, forward_chunk
from runtime.kv import LayerKV, attend
from tests.helpers import token_ids

# (H, H_kv, queries, stored, appended before the queries, head dim, (protected, start, end)): SmolLM2's geometry with
# KVzip's first chunk and a middle one, Qwen3.5's, one query head per KV head, a chunk that reaches the end (nothing
# outside R but earlier appended entries), an empty chunk and no protected prefix
CASES = [
    (9, 3, 200, 500, 0, 64, (4, 4, 204)),
    (9, 3, 120, 700, 0, 64, (4, 300, 420)),
    (8, 2, 60, 150, 0, 256, (2, 40, 100)),
    (4, 4, 64, 100, 0, 32, (2, 50, 100)),
    (6, 2, 30, 50, 7, 16, (3, 3, 50)),
    (6, 2, 30, 50, 0, 16, (0, 20, 20)),
]
BLOCKS = [1 << 20, 5000, 1]  # the default, blocks of a few queries, one query a block


def _inputs(case, dtype):
    heads, kv_heads, length, n, earlier, d, _ = case
    generator = torch.Generator().manual_seed(length + n + d)
    draw = lambda *shape: (torch.randn(*shape, generator=generator) * 2).to(dtype)  # noqa: E731
    return (draw(heads, length, d), draw(kv_heads, n, d), draw(kv_heads, n, d), draw(kv_heads, earlier + length, d),
            draw(kv_heads, earlier + length, d))


def _restricted_index(case):
    """Indices of ``R`` in ``[stored | appended]``: the protected prefix, the chunk, the queries' own entries."""
    _, _, length, n, earlier, _, (protected, start, end) = case
    own = torch.arange(n + earlier, n + earlier + length)
    return torch.cat([torch.arange(protected), torch.arange(start, end), own])


def _brute_force_max(case, query, base_keys, tail_keys):
    """Each key of ``R``: its largest probability over the queries under the full softmax renormalised over ``R``
    (float64)."""
    length, d = case[2], case[5]
    keys = torch.cat([base_keys, tail_keys], 1).double()
    probs = attention_probs(query.double(), keys, d ** -0.5, causal_tail=length)[..., _restricted_index(case)]
    return (probs / probs.sum(-1, keepdim=True)).amax(1)


@pytest.mark.parametrize("flash", [True, False], ids=["cpu-flash", "explicit"])
@pytest.mark.parametrize("block_elements", BLOCKS)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_output_is_attend_and_maxima_are_the_restricted_softmax(case, dtype, block_elements, flash, monkeypatch):
    if not flash:  # the other entries through the explicit blocks, as off the CPU
        monkeypatch.setattr(kv, "CPU_FLASH", None)
    query, base_keys, base_values, tail_keys, tail_values = _inputs(case, dtype)
    d, restricted = case[5], case[6]
    out, best = attend_with_key_max(query, base_keys, base_values, tail_keys, tail_values, d ** -0.5, restricted,
                                    block_elements=block_elements)
    n = base_keys.shape[1]
    stored = LayerKV(base_keys, base_values, torch.arange(n).expand(base_keys.shape[0], n))
    expected = attend(query, stored, tail_keys, tail_values, d ** -0.5)
    assert out.shape == expected.shape and out.dtype == dtype and best.dtype == dtype
    assert best.shape == (query.shape[0], len(_restricted_index(case)))
    # both within a few roundings of the exact output, on the scale of the values they average
    scale = float(torch.cat([base_values, tail_values], 1).abs().max())
    float32 = dtype == torch.float32
    torch.testing.assert_close(out.float(), expected.float(), rtol=1e-5 if float32 else 1.6e-2,
                               atol=(2e-6 if float32 else 4e-3) * scale)
    # float32: a few ulps of the exact maxima; bfloat16: computed in float32, then one rounding
    exact = _brute_force_max(case, query, base_keys, tail_keys)
    torch.testing.assert_close(best.double(), exact, rtol=1e-5 if float32 else 8e-3, atol=1e-7 if float32 else 1e-6)


# SmolLM2's geometry over KVzip's first chunk, Qwen3.5's and one query head per KV head
@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[2], CASES[3]])
def test_float32_maxima_are_those_of_max_attention_bit_for_bit(case):
    """The same logits and softmax as the kernel the vLLM replay scores with: KVzip's scores in the runtime's pass
    are those of the separate QK product it replaces, not only close to them."""
    query, base_keys, base_values, tail_keys, tail_values = _inputs(case, torch.float32)
    d, length, restricted = case[5], case[2], case[6]
    _, best = attend_with_key_max(query, base_keys, base_values, tail_keys, tail_values, d ** -0.5, restricted)
    keys = torch.cat([base_keys, tail_keys], 1)[:, _restricted_index(case)]
    assert torch.equal(best, max_attention(query, keys, d ** -0.5, causal_tail=length))


def test_a_query_gives_no_probability_to_later_tokens():
    # the last appended key is the last query's own token: only that query sees it
    torch.manual_seed(2)
    query, base, tail = torch.randn(2, 5, 8), torch.randn(1, 6, 8), torch.randn(1, 5, 8)
    tail[:, -1] = -100 * query[0, -1]  # the last query attends to it least of all keys
    _, best = attend_with_key_max(query, base, torch.randn(1, 6, 8), tail, torch.randn(1, 5, 8), 1.0, (1, 2, 4),
                                  block_elements=2 * 9)
    own = torch.softmax(query[:, -1] @ torch.cat([base[0, :1], base[0, 2:4], tail[0]]).T, -1)[:, -1]
    torch.testing.assert_close(best[:, -1], own)


@pytest.mark.parametrize("restricted", [(5, 4, 10), (-1, 0, 3), (0, 7, 6), (0, 2, 13)])
def test_a_restricted_set_outside_the_stored_entries_is_refused(restricted):
    with pytest.raises(ValueError, match=rf"restricted=\({restricted[0]}, .*<= end <= 12"):
        attend_with_key_max(torch.randn(2, 3, 4), torch.randn(1, 12, 4), torch.randn(1, 12, 4), torch.randn(1, 3, 4),
                            torch.randn(1, 3, 4), 1.0, restricted)


class _Maxima:
    """Declares ``restricted_keys`` and keeps what each attention layer hands it."""

    wants_recurrent_signals = False

    def __init__(self, restricted):
        self.restricted_keys, self.seen = restricted, {}

    def on_attention(self, layer_idx, hidden, query, gate, keys, values, output, restricted_max=None):
        self.seen[layer_idx] = (query, keys, restricted_max)


def test_the_forward_hands_an_observer_the_maxima_over_its_restricted_keys(tiny):
    parent = prefill(tiny("qwen3"), token_ids(80, 3), protected=4)
    observer = _Maxima((4, 30, 60))
    parent.observe(token_ids(12, 4), observer)
    assert sorted(observer.seen) == list(parent.adapter.attention_layers)
    for layer, (query, keys, best) in observer.seen.items():
        stored = parent.kv[layer].keys
        restricted = torch.cat([stored[:, :4], stored[:, 30:60], keys], 1)
        scaling = parent.adapter.attention_module(layer).scaling
        assert torch.equal(best, max_attention(query, restricted, scaling, causal_tail=12))


def test_restricted_keys_over_a_ragged_cache_are_refused_before_the_layer_runs(tiny):
    parent = prefill(tiny("qwen3"), token_ids(40, 5), protected=2)
    layer = parent.adapter.attention_layers[0]
    keys, values, positions = (parent.kv[layer].keys, parent.kv[layer].values, parent.kv[layer].positions)
    ragged = LayerKV(tuple(k[: 30 + h] for h, k in enumerate(keys)), tuple(v[: 30 + h] for h, v in enumerate(values)),
                     tuple(p[: 30 + h] for h, p in enumerate(positions)))
    state = SequenceState(base={**parent.kv, layer: ragged}, next_position=40)
    observer = _Maxima((2, 2, 20))
    with pytest.raises(ValueError, match=rf"layer {layer}: restricted_keys=\(2, 2, 20\) needs a dense stored cache, "
                                         "the layer holds a ragged cache"):
        forward_chunk(parent.adapter, state, token_ids(5, 6), observer)
    assert observer.seen == {}

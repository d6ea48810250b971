"""``runtime.kv.max_attention`` (KVzip's blockwise score) against the full probability matrix."""

import pytest
import torch

from runtime.kv import attention_probs, max_attention


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_elements", [1, 700, 1 << 22])
def test_max_attention_is_the_max_of_the_full_matrix(causal, block_elements):
    torch.manual_seed(0)
    heads, kv_heads, m, n, d = 6, 2, 37, 90, 16
    query, keys = torch.randn(heads, m, d), torch.randn(kv_heads, n, d)
    full = attention_probs(query, keys, 0.3, causal_tail=m if causal else 0).amax(1)
    blocked = max_attention(query, keys, 0.3, causal_tail=m if causal else 0, block_elements=block_elements)
    torch.testing.assert_close(blocked, full, rtol=1e-5, atol=1e-7)


def test_max_attention_causal_queries_do_not_see_later_tokens():
    # the last key is the last query's own token: only that query sees it, with probability > 0
    torch.manual_seed(1)
    query, keys = torch.randn(2, 5, 8), torch.randn(1, 9, 8)
    keys[:, -1] = -100 * query[0, -1]  # the last query attends to it least of all keys
    best = max_attention(query, keys, 1.0, causal_tail=5, block_elements=2 * 9)
    own = torch.softmax(query[:, -1] @ keys[0].T, -1)[:, -1]
    torch.testing.assert_close(best[:, -1], own)


def test_max_attention_refuses_a_partial_causal_tail():
    with pytest.raises(ValueError, match="causal_tail=3"):
        max_attention(torch.randn(2, 5, 8), torch.randn(1, 9, 8), 1.0, causal_tail=3)

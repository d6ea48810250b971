"""``runtime.explicit_attention.max_attention`` (KVzip's blockwise score where the vLLM engine ran the pass; the
runtime's pass gets the same maxima from ``attend_with_key_max``, tests/runtime/test_attend_key_max.py) against the full
probability matrix and against the kernel it replaced (one broadcast matmul per block of 4M logits), which it must equal
bit for bit so that KVzip keeps the same entries."""

import pytest
import torch

from runtime.explicit_attention import attention_probs, max_attention


def max_attention_before(query, keys, scaling, causal_tail=0, block_elements=1 << 22):
    """The kernel as it was before the GEMM per KV head (``runtime.kv`` at 1884a1b), kept as the reference."""
    num_heads, m, head_dim = query.shape
    num_kv, n = keys.shape[0], keys.shape[1]
    grouped = query.view(num_kv, num_heads // num_kv, m, head_dim)
    keys_t = keys.transpose(1, 2).unsqueeze(1)  # [Hk, 1, d, N]
    best = torch.zeros(num_kv, num_heads // num_kv, n, dtype=query.dtype, device=query.device)
    block = max(1, block_elements // (num_heads * n))
    for i0 in range(0, m, block):
        i1 = min(i0 + block, m)
        seen = n - m + i1 if causal_tail else n
        logits = torch.matmul(grouped[:, :, i0:i1], keys_t[..., :seen]) * scaling  # [Hk, G, b, seen]
        if causal_tail:
            future = torch.ones(i1 - i0, i1 - i0, dtype=torch.bool, device=query.device).triu(1)
            logits[..., seen - (i1 - i0):] = logits[..., seen - (i1 - i0):].masked_fill(future, float("-inf"))
        best[..., :seen] = torch.maximum(best[..., :seen], logits.softmax(-1).amax(2))
    return best.view(num_heads, n)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_elements", [1, 700, 1 << 22])
def test_max_attention_is_the_max_of_the_full_matrix(causal, block_elements):
    torch.manual_seed(0)
    heads, kv_heads, m, n, d = 6, 2, 37, 90, 16
    query, keys = torch.randn(heads, m, d), torch.randn(kv_heads, n, d)
    full = attention_probs(query, keys, 0.3, causal_tail=m if causal else 0).amax(1)
    blocked = max_attention(query, keys, 0.3, causal_tail=m if causal else 0, block_elements=block_elements)
    torch.testing.assert_close(blocked, full, rtol=1e-5, atol=1e-7)


# (H, H_kv, queries, keys, head dim): SmolLM2's geometry over a context of 300 and 1,200 keys (blocks of 14 to 190
# queries), Qwen3.5's, one query head per KV head, and queries that all fit one block
SHAPES = [(9, 3, 200, 500, 64), (9, 3, 300, 1200, 64), (8, 2, 150, 400, 256), (4, 4, 64, 100, 32),
          (6, 2, 30, 50, 16)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_max_attention_equals_the_previous_kernel_bit_for_bit(shape, causal, dtype):
    """The same logits (each a dot product the GEMM rounds alike), scaled, masked and normalised by the same softmax
    in the inputs' dtype: KVzip's scores, hence its kept sets, are exactly those of the kernel before."""
    heads, kv_heads, m, n, d = shape
    generator = torch.Generator().manual_seed(sum(shape))
    query = (torch.randn(heads, m, d, generator=generator) * 2).to(dtype)
    keys = (torch.randn(kv_heads, n, d, generator=generator) * 2).to(dtype)
    tail = m if causal else 0
    now = max_attention(query, keys, d ** -0.5, causal_tail=tail)
    assert now.dtype == dtype
    assert torch.equal(now, max_attention_before(query, keys, d ** -0.5, causal_tail=tail))
    assert torch.equal(now, attention_probs(query, keys, d ** -0.5, causal_tail=tail).amax(1))


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

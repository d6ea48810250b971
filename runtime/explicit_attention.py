"""Attention computed from its explicit probabilities, for what needs the weights themselves: a scorer's or a
label's probabilities (:func:`attention_probs`), each key's largest probability computed block by block
(:func:`max_attention`), and attention over a stored cache whose pass also gives KVzip's maxima
(:func:`attend_with_key_max`). Attention for its output alone is :func:`runtime.kv.attend`.
"""

from __future__ import annotations

import torch

from . import kv


def attention_probs(query: torch.Tensor, keys: torch.Tensor, scaling: float, causal_tail: int = 0) -> torch.Tensor:
    """Explicit softmax attention of queries over keys, for scorers and labels that need the weights themselves.

    Parameters
    ----------
    query : torch.Tensor
        ``[H, m, d]``.
    keys : torch.Tensor
        ``[H_kv, N, d]``; each KV head serves ``H / H_kv`` consecutive query heads (GQA).
    scaling : float
        The attention module's logit scale.
    causal_tail : int
        The last ``causal_tail`` keys are the queries' own tokens (query ``i`` is the ``i``-th of them): each query
        sees every earlier key and the tail keys up to itself. 0: every query sees every key.

    Returns
    -------
    torch.Tensor
        ``[H, m, N]`` in the dtype of ``query`` (cast the inputs to float32 for float32 probabilities).
    """
    logits = query @ keys.repeat_interleave(query.shape[0] // keys.shape[0], 0).transpose(1, 2) * scaling
    if causal_tail:
        future = torch.ones(causal_tail, causal_tail, dtype=torch.bool, device=query.device).triu(1)
        logits[..., -causal_tail:] = logits[..., -causal_tail:].masked_fill(future, float("-inf"))
    return logits.softmax(-1)


def _softmax_blocks(grouped: torch.Tensor, keys: torch.Tensor, scaling: float, causal: bool, block_elements: int):
    """Explicit softmax attention of ``grouped`` ``[Hk, G, m, d]`` over ``keys`` ``[Hk, N, d]``, block of queries by
    block so that the ``[H, m, N]`` matrix never exists.

    A block's logits are one batched GEMM per KV head, its ``G`` query heads' rows stacked and the keys read
    transposed in place; they are scaled, masked and normalised in the dtype of ``grouped`` (as
    :func:`attention_probs` computes them, and KVzip's official implementation). ``causal``: the last ``m`` keys are
    the queries' own tokens, each query sees every earlier key and its own up to itself.

    Yields
    ------
    (int, int, torch.Tensor, torch.Tensor)
        ``i0, i1`` (the block's queries), its masked logits and their softmax, both ``[Hk, G, i1 - i0, seen]``:
        ``seen`` is ``N``, or under ``causal`` the keys up to the block's last query's own (a block's queries see
        nothing after it).
    """
    num_kv, groups, m, head_dim = grouped.shape
    n = keys.shape[1]
    keys_t = keys.transpose(1, 2)  # [Hk, d, N]: a view, which the GEMM reads transposed without a copy
    block = max(1, block_elements // (num_kv * groups * n))
    for i0 in range(0, m, block):
        i1 = min(i0 + block, m)
        rows = i1 - i0
        seen = n - m + i1 if causal else n
        stacked = grouped[:, :, i0:i1].reshape(num_kv, groups * rows, head_dim)  # [Hk, G·b, d]
        logits = torch.bmm(stacked, keys_t[..., :seen]).mul_(scaling).view(num_kv, groups, rows, seen)
        if causal:
            future = torch.ones(rows, rows, dtype=torch.bool, device=grouped.device).triu(1)
            logits[..., seen - rows :].masked_fill_(future, float("-inf"))
        yield i0, i1, logits, logits.softmax(-1)


def max_attention(query: torch.Tensor, keys: torch.Tensor, scaling: float, causal_tail: int = 0,
                  block_elements: int = 1 << 19) -> torch.Tensor:
    """Each key's largest attention probability over the queries: ``attention_probs(...).amax(1)``, computed
    block of queries by block (:func:`_softmax_blocks`) so the ``[H, m, N]`` matrix never exists.

    KVzip's score where the pass ran elsewhere and only its queries and keys are at hand (the vLLM engine's replay,
    :class:`serving.served_context.Passes`); the runtime's own pass gets the same maxima from
    :func:`attend_with_key_max`.

    Parameters
    ----------
    query : torch.Tensor
        ``[H, m, d]``.
    keys : torch.Tensor
        ``[H_kv, N, d]``, GQA as in :func:`attention_probs`.
    scaling : float
    causal_tail : int
        0, or ``m``: the last ``m`` keys are the queries' own tokens, seen causally.
    block_elements : int
        About how many logits one block holds (512K float32: 2 MB, so that a block's logits stay in a core's L2
        cache through the softmax and the max; blocks of 16 MB, which do not, made them about 1.5x slower).

    Returns
    -------
    torch.Tensor
        ``[H, N]`` in the dtype of ``query``: the logits and the softmax are those of :func:`attention_probs`, bit
        for bit.
    """
    num_heads, m, head_dim = query.shape
    num_kv, n = keys.shape[0], keys.shape[1]
    if causal_tail not in (0, m):
        raise ValueError(f"causal_tail={causal_tail}: expected 0 or the number of queries ({m})")
    grouped = query.view(num_kv, num_heads // num_kv, m, head_dim)
    best = torch.zeros(num_kv, num_heads // num_kv, n, dtype=query.dtype, device=query.device)
    for _, _, _, probs in _softmax_blocks(grouped, keys, scaling, bool(causal_tail), block_elements):
        part = best[..., : probs.shape[-1]]
        torch.maximum(part, probs.amax(2), out=part)
    return best.view(num_heads, n)


def _explicit_attention(grouped, keys, values, scaling: float, causal: bool, block_elements: int,
                        best: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``grouped`` ``[Hk, G, m, d]`` over ``keys``, ``values`` ``[Hk, N, d]`` from the explicit
    probabilities of :func:`_softmax_blocks` (``causal`` as there).

    Returns the output ``[Hk, G, m, d]`` in the dtype of ``grouped`` and the log-sum-exps ``[Hk, G, m]`` (float32);
    ``best`` ``[Hk, G, N]``, when given, is raised in place to each key's largest probability over the queries.
    """
    num_kv, groups, m, head_dim = grouped.shape
    out = torch.empty_like(grouped)
    lse = torch.empty(num_kv, groups, m, dtype=torch.float32, device=grouped.device)
    for i0, i1, logits, probs in _softmax_blocks(grouped, keys, scaling, causal, block_elements):
        rows, seen = i1 - i0, probs.shape[-1]
        if best is not None:
            part = best[..., :seen]
            torch.maximum(part, probs.amax(2), out=part)
        out[:, :, i0:i1] = torch.bmm(probs.view(num_kv, groups * rows, seen), values[:, :seen]).view(
            num_kv, groups, rows, head_dim)
        # the normaliser without a second exp: a row's largest probability is e^0 / sum, at its largest logit
        lse[:, :, i0:i1] = logits.amax(-1).float() - probs.amax(-1).float().log()
    return out, lse


def attend_with_key_max(
    query: torch.Tensor,
    base_keys: torch.Tensor,
    base_values: torch.Tensor,
    tail_keys: torch.Tensor,
    tail_values: torch.Tensor,
    scale: float,
    restricted: tuple[int, int, int],
    block_elements: int = 1 << 20,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~runtime.kv.attend` over a dense stored cache, and each key of a restricted set ``R`` its largest
    probability under a softmax over ``R`` alone (KVzip's score), from one QK product and one exponential per key.

    ``R`` is the stored entries ``[0, protected)`` and ``[start, end)`` plus the queries' own ``L`` entries (the
    last of the tail). Its attention is explicit (:func:`_softmax_blocks`): a block's probabilities give both the
    keys' maxima and, through one GEMM with the values, ``R``'s share of the output. The other entries, which every
    query sees, go through the CPU's fused kernel (elsewhere: explicitly too), and the two parts are merged by
    their log-sum-exps.

    Precision: in float32 and float64 ``R``'s softmax is :func:`max_attention`'s, and so are the maxima (bit for
    bit at the default blocks in the tests; a GEMM may round a dot product differently for another number of rows).
    Below float32 it runs in float32, as the fused kernel accumulates: logits rounded to bfloat16 would make the
    output several times less accurate than :func:`~runtime.kv.attend`'s, and one softmax serves both; the maxima
    then differ from :func:`max_attention`'s bfloat16 softmax by its rounding.

    Parameters
    ----------
    query : torch.Tensor
        ``[H, L, d]`` post-RoPE queries.
    base_keys, base_values : torch.Tensor
        ``[H_kv, n, d]`` the stored entries, every one visible to every query.
    tail_keys, tail_values : torch.Tensor
        ``[H_kv, t, d]`` with ``t >= L``, appended after the stored entries; the last ``L`` rows belong to the
        query tokens (seen causally), the earlier ones are visible to every query and not in ``R``.
    scale : float
    restricted : tuple of int
        ``(protected, start, end)`` with ``0 <= protected <= start <= end <= n``.
    block_elements : int
        About how many logits one block holds: 1M float32 (4 MB); with the values' GEMM in the loop, blocks of 4 MB
        made the call 6 to 20% faster than :func:`max_attention`'s 2 MB (SmolLM2's geometry, one thread).

    Returns
    -------
    tuple of torch.Tensor
        The output ``[L, H, d]`` and the maxima ``[H, |R|]`` (``|R| = protected + end - start + L``, in ``R``'s
        order), both in the dtype of ``query``.
    """
    compute = torch.promote_types(query.dtype, torch.float32)
    num_heads, length, head_dim = query.shape
    num_kv, n, earlier = base_keys.shape[0], base_keys.shape[1], tail_keys.shape[1] - length
    protected, start, end = restricted
    if not 0 <= protected <= start <= end <= n:
        raise ValueError(f"restricted={restricted!r}: expected (protected, start, end) with 0 <= protected <= start "
                         f"<= end <= {n} (the stored entries)")
    if earlier < 0:
        raise ValueError(f"tail of {tail_keys.shape[1]} entries for {length} queries: the tail ends with theirs")
    grouped = query.view(num_kv, num_heads // num_kv, length, head_dim)
    spans = [(0, protected), (start, end)]
    keys = torch.cat([base_keys[:, a:b] for a, b in spans] + [tail_keys[:, earlier:]], 1).to(compute)
    values = torch.cat([base_values[:, a:b] for a, b in spans] + [tail_values[:, earlier:]], 1).to(compute)
    best = torch.zeros(*grouped.shape[:2], keys.shape[1], dtype=compute, device=query.device)
    out, lse = _explicit_attention(grouped.to(compute), keys, values, scale, True, block_elements, best)
    rest = [(base_keys[:, a:b], base_values[:, a:b]) for a, b in ((protected, start), (end, n)) if b > a]
    rest += [(tail_keys[:, :earlier], tail_values[:, :earlier])] if earlier else []
    if rest:
        rest_keys = torch.cat([k for k, _ in rest], 1) if len(rest) > 1 else rest[0][0]
        rest_values = torch.cat([v for _, v in rest], 1) if len(rest) > 1 else rest[0][1]
        if query.device.type == "cpu" and kv.CPU_FLASH is not None:
            rest_out, rest_lse = kv.flash_attention(grouped, rest_keys, rest_values, scale, False)
        else:
            rest_out, rest_lse = _explicit_attention(grouped.to(compute), rest_keys.to(compute),
                                                     rest_values.to(compute), scale, False, block_elements)
        out = kv.merge_attention(out, lse, rest_out, rest_lse, query.dtype)
    out = out.to(query.dtype).reshape(num_heads, length, head_dim).transpose(0, 1)
    return out, best.view(num_heads, -1).to(query.dtype)

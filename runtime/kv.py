"""Attention KV storage of one layer, and attention over a (possibly compacted, possibly ragged) cache.

A compacted layer keeps, per KV head, its own sorted set of context entries. When every head of the layer
keeps the same count the entries live in one dense ``[H_kv, k, d]`` tensor; otherwise each head owns a
``[k_h, d]`` tensor, so a head that keeps fewer entries really stores fewer bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

Heads = torch.Tensor | tuple[torch.Tensor, ...]


@dataclass
class LayerKV:
    """Keys, values and original positions of one attention layer.

    Attributes
    ----------
    keys, values : torch.Tensor or tuple of torch.Tensor
        Dense ``[H_kv, k, d]``, or ragged: one ``[k_h, d]`` tensor per KV head. Keys are post-norm,
        post-RoPE at their original positions.
    positions : torch.Tensor or tuple of torch.Tensor
        ``[H_kv, k]`` or one ``[k_h]`` tensor per head: the context position of every stored entry.
    valid : torch.Tensor or None
        Dense layouts only: ``[H_kv, k]``, False where an entry is padding that attention must not see (several
        children padded to one shape to be answered as a batch, :mod:`runtime.batch`). None: every entry is real.
    """

    keys: Heads
    values: Heads
    positions: Heads
    valid: torch.Tensor | None = None

    @property
    def ragged(self) -> bool:
        return isinstance(self.keys, tuple)

    @property
    def num_heads(self) -> int:
        return len(self.keys) if self.ragged else self.keys.shape[0]

    def lengths(self) -> list[int]:
        """Number of stored entries per KV head."""
        return [k.shape[0] for k in self.keys] if self.ragged else [self.keys.shape[1]] * self.keys.shape[0]

    def head(self, h: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(keys [k_h, d], values [k_h, d], positions [k_h])`` of KV head ``h``."""
        return self.keys[h], self.values[h], self.positions[h]

    @property
    def nbytes(self) -> int:
        """Bytes of stored keys and values (positions are bookkeeping and counted separately)."""
        tensors = (*self.keys, *self.values) if self.ragged else (self.keys, self.values)
        return sum(t.nbytes for t in tensors)

    def gather(self, keep: list[torch.Tensor]) -> "LayerKV":
        """New tensors holding only the entries at indices ``keep[h]`` of each head (physical copy).

        Parameters
        ----------
        keep : list of torch.Tensor
            One sorted ``[k_h]`` long tensor of indices into this layer's stored entries per KV head.
        """
        if len({int(k.numel()) for k in keep}) == 1 and not self.ragged:
            index = torch.stack(keep).to(self.keys.device)
            expand = index.unsqueeze(-1).expand(-1, -1, self.keys.shape[-1])
            # gather allocates new tensors: nothing of the parent's storage is referenced
            return LayerKV(self.keys.gather(1, expand), self.values.gather(1, expand), self.positions.gather(1, index))
        per_head = [self.head(h) for h in range(self.num_heads)]
        return LayerKV(
            tuple(k.index_select(0, i.to(k.device)) for (k, _, _), i in zip(per_head, keep)),
            tuple(v.index_select(0, i.to(v.device)) for (_, v, _), i in zip(per_head, keep)),
            tuple(p.index_select(0, i.to(p.device)) for (_, _, p), i in zip(per_head, keep)),
        )


# Below this many query tokens (decode steps) the two segments are attended without concatenating them: a step
# reads the cache once, and concatenating would copy the whole cache every step. From it on (prefill chunks,
# questions, KVzip's reconstruction) the fused kernel is several times faster than explicit logits, except over a
# padded batch cache (``valid`` set, :mod:`runtime.batch`): under ``vmap`` the fused kernel has no batching rule and
# runs once per member, after copying every member's cache into the concatenation (2.3 s of 19 s answering 15
# children of a 2K context on SmolLM2).
FUSED_MIN_QUERIES = 16


# CPU's fused attention with its log-sum-exp (an ATen op without a public wrapper): a fully visible segment and a
# causal square attended apart and merged by their log-sum-exps cost what the keys cost, where one call with an
# explicit mask over both runs about 1.5x slower (2,048 queries over 2,048 stored keys and themselves, one thread)
_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _flash(query, keys, values, scale: float, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """:data:`_CPU_FLASH` of ``query`` ``[Hk, G, L, d]`` over ``keys``, ``values`` ``[Hk, k, d]`` (causal: the
    keys are the queries' own); returns the output ``[Hk, G, L, d]`` and its log-sum-exps ``[Hk, G, L]``, float32."""
    shape = (-1, query.shape[1], -1, -1)  # one key head serves its G query heads: a view, nothing copied
    out, lse = _CPU_FLASH(query, keys[:, None].expand(shape), values[:, None].expand(shape), is_causal=causal,
                          scale=scale)[:2]
    return out.float(), lse.float()


def _merge(out_a, lse_a, out_b, lse_b, dtype: torch.dtype) -> torch.Tensor:
    """Attention over two disjoint key sets from each one's output ``[..., d]`` and log-sum-exp ``[...]`` (float32):
    ``(e^a·o_a + e^b·o_b) / (e^a + e^b)``, in ``dtype``."""
    top = torch.maximum(lse_a, lse_b)
    w_a, w_b = (lse_a - top).exp().unsqueeze(-1), (lse_b - top).exp().unsqueeze(-1)
    return ((out_a.float() * w_a + out_b.float() * w_b) / (w_a + w_b)).to(dtype)


def _attend_merged(query, visible_keys, visible_values, tail_keys, tail_values, scale: float) -> torch.Tensor:
    """:func:`_attend_two_segments` on a CPU without a mask: the stored entries and the tail before the queries
    (every query sees them) in one fused call, the queries' own ``L`` tail entries (causal) in another, merged by
    their log-sum-exps (:func:`_merge`). Shapes as there."""
    length = query.shape[2]
    earlier = tail_keys.shape[1] - length
    if earlier:
        keys, values = tail_keys[:, :earlier], tail_values[:, :earlier]
        if visible_keys is not None:
            keys, values = torch.cat([visible_keys, keys], 1), torch.cat([visible_values, values], 1)
        visible_keys, visible_values = keys, values
    own, own_lse = _flash(query, tail_keys[:, earlier:], tail_values[:, earlier:], scale, True)
    if visible_keys is None:
        return own.to(query.dtype)
    seen, seen_lse = _flash(query, visible_keys, visible_values, scale, False)
    return _merge(own, own_lse, seen, seen_lse, query.dtype)


def _attend_two_segments(
    query: torch.Tensor,
    base_keys: torch.Tensor | None,
    base_values: torch.Tensor | None,
    tail_keys: torch.Tensor,
    tail_values: torch.Tensor,
    scale: float,
    base_valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax attention over ``[base | tail]`` (``base_valid`` ``[Hk, k]``: False where a base entry is padding).

    ``query`` is ``[Hk, G, L, d]``; base ``[Hk, k, d]`` is entirely visible; tail ``[Hk, t, d]`` ends with the
    ``L`` query tokens themselves and is masked causally, aligned to its end. Returns ``[Hk, G, L, d]``.
    """
    length, tail_len = query.shape[2], tail_keys.shape[1]
    has_base = base_keys is not None and base_keys.shape[1] > 0
    if length >= FUSED_MIN_QUERIES and base_valid is None and query.device.type == "cpu" and _CPU_FLASH is not None:
        return _attend_merged(query, base_keys if has_base else None, base_values if has_base else None, tail_keys,
                              tail_values, scale)
    query_pos = torch.arange(tail_len - length, tail_len, device=query.device)
    visible = torch.arange(tail_len, device=query.device)[None, :] <= query_pos[:, None]  # [L, t]
    if length >= FUSED_MIN_QUERIES and base_valid is None:
        keys = torch.cat([base_keys, tail_keys], 1) if has_base else tail_keys
        values = torch.cat([base_values, tail_values], 1) if has_base else tail_values
        mask = visible.expand(query.shape[0], 1, -1, -1)
        if has_base:
            seen = torch.ones_like(base_keys[..., 0], dtype=torch.bool)
            mask = torch.cat([seen[:, None, None, :].expand(-1, -1, length, -1), mask], -1)  # [Hk, 1, L, k + t]
        # grouped layout: batch = KV head, heads = its G query heads, one key head each
        return F.scaled_dot_product_attention(query, keys[:, None], values[:, None], attn_mask=mask, scale=scale,
                                              enable_gqa=True)
    tail_logits = torch.einsum("hgld,htd->hglt", query, tail_keys).float() * scale
    tail_logits = tail_logits.masked_fill(~visible, float("-inf"))
    if not has_base:
        probs = tail_logits.softmax(-1).to(query.dtype)
        return torch.einsum("hglt,htd->hgld", probs, tail_values)
    base_logits = torch.einsum("hgld,hkd->hglk", query, base_keys).float() * scale
    if base_valid is not None:
        base_logits = base_logits.masked_fill(~base_valid[:, None, None, :], float("-inf"))
    probs = torch.cat([base_logits, tail_logits], dim=-1).softmax(-1).to(query.dtype)
    kb = base_keys.shape[1]
    return torch.einsum("hglk,hkd->hgld", probs[..., :kb], base_values) + torch.einsum(
        "hglt,htd->hgld", probs[..., kb:], tail_values
    )


def attend(
    query: torch.Tensor,
    base: LayerKV | None,
    tail_keys: torch.Tensor,
    tail_values: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Attention of new tokens over a stored (compacted) cache plus the tokens appended after it.

    Every query token sees every stored entry of its KV head and, causally, the appended tokens up to itself.
    This is the mask of a question over a compacted context: ``is_causal`` with ``q_len != kv_len`` would
    align the diagonal to the wrong corner.

    Parameters
    ----------
    query : torch.Tensor
        ``[H, L, d]`` post-RoPE queries.
    base : LayerKV or None
        The stored context entries (``None``: nothing stored, e.g. the prefill itself).
    tail_keys, tail_values : torch.Tensor
        ``[H_kv, t, d]`` with ``t >= L``; the last ``L`` rows belong to the query tokens.
    scale : float

    Returns
    -------
    torch.Tensor
        ``[L, H, d]``.
    """
    num_heads, length, head_dim = query.shape
    num_kv = tail_keys.shape[0]
    grouped = query.view(num_kv, num_heads // num_kv, length, head_dim)
    if base is None and tail_keys.shape[1] == length:
        out = F.scaled_dot_product_attention(
            query.unsqueeze(0), tail_keys.unsqueeze(0), tail_values.unsqueeze(0),
            is_causal=True, scale=scale, enable_gqa=True,
        )[0]
        return out.transpose(0, 1)
    if base is None or not base.ragged:
        out = _attend_two_segments(
            grouped,
            None if base is None else base.keys,
            None if base is None else base.values,
            tail_keys, tail_values, scale,
            None if base is None else base.valid,
        )
    else:
        out = torch.cat(
            [
                _attend_two_segments(
                    grouped[h : h + 1], base.keys[h][None], base.values[h][None],
                    tail_keys[h : h + 1], tail_values[h : h + 1], scale,
                )
                for h in range(num_kv)
            ]
        )
    return out.reshape(num_heads, length, head_dim).transpose(0, 1)


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
    :mod:`serving.worker`); the runtime's own pass gets the same maxima from :func:`attend_with_key_max`.

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
    """:func:`attend` over a dense stored cache, and each key of a restricted set ``R`` its largest probability
    under a softmax over ``R`` alone (KVzip's score), from one QK product and one exponential per key.

    ``R`` is the stored entries ``[0, protected)`` and ``[start, end)`` plus the queries' own ``L`` entries (the
    last of the tail). Its attention is explicit (:func:`_softmax_blocks`): a block's probabilities give both the
    keys' maxima and, through one GEMM with the values, ``R``'s share of the output. The other entries, which every
    query sees, go through the CPU's fused kernel (elsewhere: explicitly too), and the two parts are merged by
    their log-sum-exps.

    Precision: in float32 and float64 ``R``'s softmax is :func:`max_attention`'s, and so are the maxima (bit for
    bit at the default blocks in the tests; a GEMM may round a dot product differently for another number of rows).
    Below float32 it runs in float32, as the fused kernel accumulates: logits rounded to bfloat16 would make the
    output several times less accurate than :func:`attend`'s, and one softmax serves both; the maxima then differ
    from :func:`max_attention`'s bfloat16 softmax by its rounding.

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
        if query.device.type == "cpu" and _CPU_FLASH is not None:
            rest_out, rest_lse = _flash(grouped, rest_keys, rest_values, scale, False)
        else:
            rest_out, rest_lse = _explicit_attention(grouped.to(compute), rest_keys.to(compute),
                                                     rest_values.to(compute), scale, False, block_elements)
        out = _merge(out, lse, rest_out, rest_lse, query.dtype)
    out = out.to(query.dtype).reshape(num_heads, length, head_dim).transpose(0, 1)
    return out, best.view(num_heads, -1).to(query.dtype)

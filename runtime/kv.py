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
CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def flash_attention(query, keys, values, scale: float, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """:data:`CPU_FLASH` of ``query`` ``[Hk, G, L, d]`` over ``keys``, ``values`` ``[Hk, k, d]`` (causal: the
    keys are the queries' own); returns the output ``[Hk, G, L, d]`` and its log-sum-exps ``[Hk, G, L]``, float32."""
    shape = (-1, query.shape[1], -1, -1)  # one key head serves its G query heads: a view, nothing copied
    out, lse = CPU_FLASH(query, keys[:, None].expand(shape), values[:, None].expand(shape), is_causal=causal,
                         scale=scale)[:2]
    return out.float(), lse.float()


def merge_attention(out_a, lse_a, out_b, lse_b, dtype: torch.dtype) -> torch.Tensor:
    """Attention over two disjoint key sets from each one's output ``[..., d]`` and log-sum-exp ``[...]`` (float32):
    ``(e^a·o_a + e^b·o_b) / (e^a + e^b)``, in ``dtype``."""
    top = torch.maximum(lse_a, lse_b)
    w_a, w_b = (lse_a - top).exp().unsqueeze(-1), (lse_b - top).exp().unsqueeze(-1)
    return ((out_a.float() * w_a + out_b.float() * w_b) / (w_a + w_b)).to(dtype)


def _attend_merged(query, visible_keys, visible_values, tail_keys, tail_values, scale: float) -> torch.Tensor:
    """:func:`_attend_two_segments` on a CPU without a mask: the stored entries and the tail before the queries
    (every query sees them) in one fused call, the queries' own ``L`` tail entries (causal) in another, merged by
    their log-sum-exps (:func:`merge_attention`). Shapes as there."""
    length = query.shape[2]
    earlier = tail_keys.shape[1] - length
    if earlier:
        keys, values = tail_keys[:, :earlier], tail_values[:, :earlier]
        if visible_keys is not None:
            keys, values = torch.cat([visible_keys, keys], 1), torch.cat([visible_values, values], 1)
        visible_keys, visible_values = keys, values
    own, own_lse = flash_attention(query, tail_keys[:, earlier:], tail_values[:, earlier:], scale, True)
    if visible_keys is None:
        return own.to(query.dtype)
    seen, seen_lse = flash_attention(query, visible_keys, visible_values, scale, False)
    return merge_attention(own, own_lse, seen, seen_lse, query.dtype)


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
    if length >= FUSED_MIN_QUERIES and base_valid is None and query.device.type == "cpu" and CPU_FLASH is not None:
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

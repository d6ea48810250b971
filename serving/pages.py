"""Reading and writing single entries of an attention layer's paged KV cache, whatever the backend's in-block layout.

vLLM's attention backends lay a block out their own way (the CPU backend stores the keys of a block and head
transposed for its vector ISA and packs them differently for AMX). Rather than hard-code one layout, the layout is
learned once per layer by writing coded entries through the backend's own ``do_kv_cache_update`` into a scratch
block and finding where each coded scalar landed; reads then gather through that map and writes go through the
backend's op again, so a compacted block is exactly what the backend would have written itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .vllm_internals import runner as vi

# Codes are written in the cache dtype; bfloat16 represents every integer up to 256 exactly, so a token offset or a
# channel index is written in base-128 digits (1 ... 128), one pass per digit.
_DIGIT = 128


@dataclass
class PageLayout:
    """Where entry ``(token offset t, KV head h, channel c)`` of one block lives in that block's flat storage.

    Attributes
    ----------
    block_size : int
    key_index, value_index : torch.Tensor
        ``[block_size, H_kv, D]`` int64 offsets into ``kv_cache[block].reshape(-1)``.
    """

    block_size: int
    key_index: torch.Tensor
    value_index: torch.Tensor

    @classmethod
    def learn(cls, layer, block_size: int, num_kv_heads: int, head_size: int) -> "PageLayout":
        """Map the layout of ``layer`` (a vLLM ``Attention``, its cache ``[num_blocks, ...]``) by writing coded
        entries into a one-block scratch cache with the backend's own write op."""
        cache = vi.attention_cache(layer)
        scratch = torch.zeros((1, *cache.shape[1:]), dtype=cache.dtype, device=cache.device)
        slots = torch.arange(block_size, device=cache.device)
        shape = (block_size, num_kv_heads, head_size)
        coordinates = torch.stack(torch.meshgrid(*(torch.arange(s) for s in shape), indexing="ij"), -1)  # [B, H, D, 3]
        found = [torch.zeros(scratch.numel(), 3, dtype=torch.long) for _ in range(2)]  # keys, values
        hit = [torch.zeros(scratch.numel(), dtype=torch.bool) for _ in range(2)]
        for axis in range(3):
            for digit in range(_digits(shape[axis])):
                # codes start at 1 so that a written entry is told from untouched storage (0)
                code = (coordinates[..., axis] // _DIGIT**digit % _DIGIT + 1).to(cache.dtype).to(cache.device)
                for target in range(2):
                    scratch.zero_()
                    entries = [torch.zeros_like(code), torch.zeros_like(code)]
                    entries[target] = code
                    vi.write_entries(layer, entries[0], entries[1], slots, cache=scratch)
                    written = scratch.reshape(-1).long().cpu()
                    hit[target] |= written > 0
                    found[target][:, axis] += (written - 1).clamp(min=0) * _DIGIT**digit
        key_index, value_index = (_invert(found[i], hit[i], shape).to(cache.device) for i in range(2))
        return cls(block_size, key_index, value_index)

    def read(self, cache: torch.Tensor, block_ids: list[int], n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[H_kv, n, D]`` of the first ``n`` tokens of a request whose blocks are ``block_ids``."""
        pages = cache[torch.as_tensor(block_ids[: -(-n // self.block_size)], dtype=torch.long, device=cache.device)]
        flat = pages.reshape(pages.shape[0], -1)
        keys = flat[:, self.key_index].reshape(-1, *self.key_index.shape[1:])[:n]  # [n, H, D]
        values = flat[:, self.value_index].reshape(-1, *self.value_index.shape[1:])[:n]
        return keys.transpose(0, 1), values.transpose(0, 1)

    def slots(self, block_ids: list[int], n: int, device) -> torch.Tensor:
        """Slot numbers of token offsets ``0 ... n - 1`` of a request (``block * block_size + offset``)."""
        offsets = torch.arange(n)
        blocks = torch.as_tensor(block_ids, dtype=torch.long)[offsets // self.block_size]
        return (blocks * self.block_size + offsets % self.block_size).to(device)


def _digits(size: int) -> int:
    digits = 1
    while _DIGIT**digits < size:
        digits += 1
    return digits


def _invert(found: torch.Tensor, hit: torch.Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
    """``found[offset] = (t, h, c)`` at every written ``offset`` -> ``index[t, h, c] = offset``."""
    index = torch.full(shape, -1, dtype=torch.long)
    offsets = hit.nonzero()[:, 0]
    t, h, c = found[offsets].unbind(-1)
    index[t, h, c] = offsets
    if offsets.numel() != index.numel() or bool((index < 0).any()):
        raise RuntimeError(f"the backend's KV layout is not a one-to-one placement of entries: {offsets.numel()} "
                           f"offsets written for {index.numel()} entries")
    return index

"""Ada-KV (arXiv 2407.11550): each layer keeps the flat budget, split across its KV heads by the press's scores.

Within a layer, the layer's H_kv · k entries go to the top scores over all its heads together (a head whose scores
are concentrated gives entries to a head whose scores are spread), after every head is guaranteed a floor of
``safeguard`` · k entries (Ada-KV's safety budget). Heads then keep different counts: the runtime's ragged layout
stores exactly that.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.errors import UsageError

from .base import Allocator, BudgetRequest


@dataclass
class AdaKVAllocator(Allocator):
    """Parameters: ``safeguard`` in [0, 1], the fraction of the flat per-head count every head keeps (0.2)."""

    safeguard: float = 0.2
    name = "adakv"
    needs_scores = True

    def __post_init__(self):
        if not 0 <= self.safeguard <= 1:
            raise UsageError(f"safeguard={self.safeguard!r} must be in [0, 1] (a fraction of the flat per-head count)")

    def allocate(self, request: BudgetRequest) -> dict[int, list[int]]:
        if request.scores is None:
            raise ValueError("the adakv allocator splits each layer's budget by the press's scores; none were given")
        k, heads = request.per_head, request.num_kv_heads
        floor = min(int(self.safeguard * k), k)
        counts = {}
        for layer in request.layers:
            scores = request.scores[layer].float()  # [H_kv, n_body]
            # each head's first `floor` entries are reserved; the rest of the layer's budget goes to the best of
            # the remaining entries of all heads (ties: lower head, then lower position, as the stable sort keeps)
            order = torch.sort(-scores, dim=1, stable=True).indices
            reserved = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, order[:, :floor], True)
            rest = scores.masked_fill(reserved, float("-inf")).flatten()
            extra = heads * k - heads * floor
            chosen = torch.sort(-rest, stable=True).indices[:extra]
            per_head = torch.bincount(chosen // scores.shape[1], minlength=heads)
            counts[layer] = [floor + int(c) for c in per_head]
        return counts

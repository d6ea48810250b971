"""Global top-B over all (layer, head, entry) scores — KVzip's own allocation.

Only meaningful when every layer's scores share one scale (attention probabilities, predicted utilities);
presses declare this with ``comparable_scale``; the harness refuses the others before any work starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Allocator, BudgetRequest


@dataclass
class GlobalAllocator(Allocator):
    name = "global"
    needs_scores = True
    compares_layers = True

    def allocate(self, request: BudgetRequest) -> dict[int, list[int]]:
        if request.scores is None:
            raise ValueError("the global allocator needs the press's scores")
        flat = torch.cat([request.scores[layer].float().reshape(-1) for layer in request.layers])
        # exact top-B (stable: earlier layer/head/position first on ties) instead of KVzip's strict threshold
        order = torch.sort(-flat, stable=True).indices[: request.total]
        winners = torch.zeros_like(flat, dtype=torch.long)
        winners[order] = 1
        per_head = winners.view(len(request.layers), request.num_kv_heads, request.n_body).sum(-1)
        return {layer: per_head[i].tolist() for i, layer in enumerate(request.layers)}

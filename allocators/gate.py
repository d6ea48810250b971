"""Gate-proportional (paper §4.2): layer ℓ keeps K_ℓ ∝ w_ℓ per head, w_ℓ the calibrated mean output gate."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .base import Allocator, BudgetRequest
from .integerize import largest_remainder


@dataclass
class GateAllocator(Allocator):
    name = "gate"
    needs_layer_weights = True

    def allocate(self, request: BudgetRequest) -> dict[int, list[int]]:
        if request.layer_weights is None:
            raise ValueError("the gate allocator needs calibrated layer gate weights: run `bench calibrate --model PATH`")
        missing = [layer for layer in request.layers if layer not in request.layer_weights]
        if missing:
            raise ValueError(f"layer gate weights have no entry for attention layers {missing}")
        weights = [float(request.layer_weights[layer]) for layer in request.layers]
        if not all(math.isfinite(w) for w in weights) or min(weights) < 0 or sum(weights) <= 0:
            raise ValueError(f"layer gate weights must be finite, non-negative and with a positive sum, got {weights}")
        per_layer_total = request.per_head * len(request.layers)
        targets = [per_layer_total * w / sum(weights) for w in weights]
        # all heads of a layer keep the same count, so the layer count is integerised, then copied to its heads
        counts = largest_remainder(targets, per_layer_total, 0, request.n_body)
        return {layer: [c] * request.num_kv_heads for layer, c in zip(request.layers, counts)}

"""Gate-proportional (paper §4.2): layer ℓ keeps K_ℓ ∝ w_ℓ per head, w_ℓ the calibrated mean output gate."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .base import Allocator, BudgetRequest
from .integerize import split_by_layer_weights


@dataclass
class GateAllocator(Allocator):
    name = "gate"
    runs_in_engine = True
    needs_layer_weights = True

    def allocate(self, request: BudgetRequest) -> dict[int, list[int]]:
        if request.layer_weights is None:
            raise ValueError("the gate allocator needs calibrated layer gate weights: "
                             "run `bench calibrate --model PATH`")
        missing = [layer for layer in request.layers if layer not in request.layer_weights]
        if missing:
            raise ValueError(f"layer gate weights have no entry for attention layers {missing}")
        weights = [float(request.layer_weights[layer]) for layer in request.layers]
        if not all(math.isfinite(w) for w in weights) or min(weights) < 0 or sum(weights) <= 0:
            raise ValueError(f"layer gate weights must be finite, non-negative and with a positive sum, got {weights}")
        return split_by_layer_weights(request, weights)

"""PyramidKV schedule (paper App. F): arithmetic decrease over the attention layers, same total as flat."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.errors import UsageError

from .base import Allocator, BudgetRequest
from .integerize import largest_remainder


@dataclass
class PyramidAllocator(Allocator):
    """k_min = k/β, k_max = 2k − k_min; layer f of L gets k_max − f(k_max − k_min)/(L − 1), at least ``floor``."""

    beta: float = 20.0
    floor: int = 4
    name = "pyramid"
    runs_in_engine = True

    def __post_init__(self):
        if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)) or not self.beta > 0:
            raise UsageError(f"beta={self.beta!r}: expected a number > 0 (the first layer's count k_min = k / beta)")
        if isinstance(self.floor, bool) or not isinstance(self.floor, int) or self.floor < 0:
            raise UsageError(f"floor={self.floor!r}: expected an integer >= 0 (entries every layer keeps at least)")

    def allocate(self, request: BudgetRequest) -> dict[int, list[int]]:
        k, count = request.per_head, len(request.layers)
        k_min = k / self.beta
        k_max = 2 * k - k_min
        targets = [k_max - f * (k_max - k_min) / (count - 1) if count > 1 else k for f in range(count)]
        low = min(self.floor, k, request.n_body)
        counts = largest_remainder(targets, k * count, low, request.n_body)
        return {layer: [c] * request.num_kv_heads for layer, c in zip(request.layers, counts)}

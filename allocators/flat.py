"""Flat: every layer and head keeps round(p · (n − prot)) entries."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Allocator, BudgetRequest


@dataclass
class FlatAllocator(Allocator):
    name = "flat"
    runs_in_engine = True

    def allocate(self, request: BudgetRequest) -> dict[int, list[int]]:
        return {layer: [request.per_head] * request.num_kv_heads for layer in request.layers}

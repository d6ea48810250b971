"""Per-layer: the budget B split across attention layers in proportion to user-given weights, as kvpress's
``PerLayerCompressionPress`` sets one compression ratio per layer — but with the total held at exactly B, so that
the rule compares with the others at the same memory."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from runtime.errors import UsageError

from .base import Allocator, BudgetRequest
from .integerize import split_by_layer_weights

SIGNIFICANT_DIGITS = 12
"""The precision weights are held to: ``0.3 / 0.1`` is 2.9999999999999996 in floats, one setting with ``3``."""


@dataclass
class PerLayerAllocator(Allocator):
    """Parameters: ``weights``, one non-negative number per attention layer in depth order (their scale does not
    matter: layer ℓ keeps B · w_ℓ / Σw, capped at the body and re-spread). They are held divided by the smallest
    positive one and rounded to :data:`SIGNIFICANT_DIGITS`, so that one setting has one form (``2/4`` and
    ``0.1/0.2`` are ``1/2``)."""

    weights: list[float] = field(default_factory=list)
    name = "perlayer"
    runs_in_engine = True

    def __post_init__(self):
        if not self.weights:
            raise UsageError("perlayer needs its weights, one per attention layer: perlayer[weights=1/2/3] on the "
                             "command line, allocators.get('perlayer', weights=[1, 2, 3]) in the library")
        weights = [float(w) for w in self.weights]
        if not all(math.isfinite(w) and w >= 0 for w in weights) or sum(weights) <= 0:
            raise UsageError(f"perlayer weights={self.weights!r}: give one finite, non-negative weight per attention "
                             "layer, with a positive sum (e.g. weights=1/2/3)")
        smallest = min(w for w in weights if w > 0)
        held = [w / smallest for w in weights]
        if not all(math.isfinite(w) for w in held):
            raise UsageError(f"perlayer weights={self.weights!r}: the largest is more than 1e308 times the smallest "
                             "positive one; give weights of a smaller spread (0 for a layer that keeps nothing)")
        self.weights = [float(f"{w:.{SIGNIFICANT_DIGITS}g}") for w in held]

    def check_layers(self, count: int) -> None:
        if len(self.weights) != count:
            raise UsageError(f"perlayer has {len(self.weights)} weights; the model has {count} attention layers: "
                             "give one weight per layer (weights=w1/w2/…)")

    def allocate(self, request: BudgetRequest) -> dict[int, list[int]]:
        self.check_layers(len(request.layers))
        return split_by_layer_weights(request, self.weights)

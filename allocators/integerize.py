"""Largest-remainder (Hamilton) integerisation with bounds: integer parts that sum exactly to the total."""

from __future__ import annotations

import math


def round_half_up(x: float) -> int:
    # Python's round() is banker's rounding; the paper's round(p·(n − prot)) is the usual half-up
    return int(math.floor(x + 0.5 + 1e-9))


def split_by_layer_weights(request, weights: list[float]) -> dict[int, list[int]]:
    """Counts of ``request`` (an ``allocators.BudgetRequest``): the budget split across its layers in proportion to
    ``weights`` (one per layer, positive sum), capped at the body and re-spread, the same count for every head."""
    per_layer_total = request.per_head * len(request.layers)
    targets = [per_layer_total * w / sum(weights) for w in weights]
    counts = largest_remainder(targets, per_layer_total, 0, request.n_body)
    return {layer: [c] * request.num_kv_heads for layer, c in zip(request.layers, counts)}


def largest_remainder(targets: list[float], total: int, low: list[int] | int = 0, high: list[int] | int | None = None):
    """Integers ``b_i`` with ``Σ b_i = total`` and ``low_i <= b_i <= high_i``, closest to ``targets`` in the
    largest-remainder sense; entries pinned at a bound hand their surplus or deficit to the others in proportion.

    Raises ``ValueError`` if ``total`` cannot be met within the bounds.
    """
    count = len(targets)
    low = [low] * count if isinstance(low, int) else list(low)
    high = [total] * count if high is None else [high] * count if isinstance(high, int) else list(high)
    if not sum(low) <= total <= sum(high):
        raise ValueError(f"total {total} cannot be split within bounds summing to [{sum(low)}, {sum(high)}]")
    values = [float(t) for t in targets]
    free = set(range(count))
    # pin entries outside their bounds and re-spread the remainder over the free ones until stable
    while True:
        pinned = {i: min(max(values[i], low[i]), high[i]) for i in free if not low[i] <= values[i] <= high[i]}
        if not pinned:
            break
        for i, v in pinned.items():
            values[i] = v
            free.discard(i)
        remaining = total - sum(values[i] for i in range(count) if i not in free)
        weight = sum(values[i] for i in free)
        for i in free:
            values[i] = remaining * values[i] / weight if weight > 0 else remaining / len(free)
    floors = [min(max(math.floor(v), low[i]), high[i]) for i, v in enumerate(values)]
    short = total - sum(floors)
    order = sorted(range(count), key=lambda i: (-(values[i] - math.floor(values[i])), i))
    step = 1 if short > 0 else -1
    while short != 0:
        moved = False
        for i in (order if step > 0 else reversed(order)):
            if short == 0:
                break
            if low[i] <= floors[i] + step <= high[i]:
                floors[i] += step
                short -= step
                moved = True
        if not moved:
            raise ValueError("largest_remainder could not meet the total within the bounds")
    return floors

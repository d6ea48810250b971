"""Scores + counts -> keep plan -> compacted child: the one selection every (press, allocator) pair shares."""

from __future__ import annotations

import allocators
from allocators import Allocator, BudgetRequest
from runtime import Child, KeepPlan, Parent

from .base import Press, Scores
from .registry import get


def keep_fraction_from(keep_fraction: float | None, compression_ratio: float | None) -> float:
    """Accept either the kept fraction p or kvpress's ``compression_ratio`` = 1 − p (exactly one)."""
    if (keep_fraction is None) == (compression_ratio is None):
        raise ValueError("give exactly one of keep_fraction (p) or compression_ratio (1 - p)")
    p = keep_fraction if keep_fraction is not None else 1.0 - compression_ratio
    if not 0 < p <= 1:
        raise ValueError(f"kept fraction {p} is outside (0, 1] (compression_ratio must be in [0, 1))")
    return p


def check_pair(press: Press, allocator: Allocator) -> None:
    """Refuse combinations that are not meaningful before any work starts."""
    if allocator.needs_scores and not press.comparable_scale:
        raise ValueError(
            f"the {allocator.name!r} allocator ranks scores across layers, but {press.name!r} scores are not on one "
            f"scale across layers; use it with a press whose scores are (kvzip, gatesight)"
        )


def plan_for(
    parent: Parent,
    scores: Scores,
    allocator: Allocator,
    keep_fraction: float,
    layer_weights: dict[int, float] | None = None,
) -> KeepPlan:
    """The keep plan of ``allocator``'s counts filled with each head's top-scoring body entries."""
    adapter = parent.adapter
    request = BudgetRequest(
        keep_fraction=keep_fraction,
        n_body=parent.n - parent.protected,
        layers=adapter.attention_layers,
        num_kv_heads=adapter.geometry.num_kv_heads,
        scores=scores if allocator.needs_scores else None,
        layer_weights=layer_weights,
    )
    return KeepPlan.from_scores(scores, allocator.allocate(request), parent.protected)


def compress(
    parent: Parent,
    press: Press | str,
    allocator: Allocator | str = "flat",
    keep_fraction: float | None = None,
    compression_ratio: float | None = None,
    layer_weights: dict[int, float] | None = None,
) -> Child:
    """Score ``parent`` with ``press``, allocate with ``allocator``, and fork the compacted child.

    >>> child = compress(parent, "snapkv", "pyramid", keep_fraction=0.2)
    """
    press = get(press) if isinstance(press, str) else press
    allocator = allocators.get(allocator) if isinstance(allocator, str) else allocator
    p = keep_fraction_from(keep_fraction, compression_ratio)
    check_pair(press, allocator)
    press.check(parent.adapter)
    return parent.fork(plan_for(parent, press.score(parent), allocator, p, layer_weights))

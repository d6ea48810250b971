"""How much each attention layer (and head) keeps. Imports neither presses nor bench."""

from __future__ import annotations

from dataclasses import fields

from .adakv import AdaKVAllocator
from .base import Allocator, BudgetRequest, check_keep_fraction
from .flat import FlatAllocator
from .gate import GateAllocator
from .global_topk import GlobalAllocator
from .integerize import largest_remainder
from .per_layer import PerLayerAllocator
from .pyramid import PyramidAllocator

ALLOCATORS: dict[str, type[Allocator]] = {
    cls.name: cls
    for cls in (FlatAllocator, GateAllocator, PyramidAllocator, GlobalAllocator, AdaKVAllocator, PerLayerAllocator)
}


def available() -> list[str]:
    return list(ALLOCATORS)


def get(name: str, **kwargs) -> Allocator:
    """An allocator by registry name; unknown names raise ``ValueError`` listing the valid ones."""
    if name not in ALLOCATORS:
        raise ValueError(f"unknown allocator {name!r}; available: {', '.join(ALLOCATORS)}")
    valid = [f.name for f in fields(ALLOCATORS[name]) if f.init]
    unknown = [key for key in kwargs if key not in valid]
    if unknown:
        raise ValueError(f"{name} has no option {unknown[0]!r}; valid: {', '.join(valid) or 'none'}")
    return ALLOCATORS[name](**kwargs)


__all__ = ["ALLOCATORS", "Allocator", "BudgetRequest", "available", "check_keep_fraction", "get", "largest_remainder"]

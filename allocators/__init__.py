"""How much each attention layer (and head) keeps. Imports neither presses nor bench (its options are typed by
:mod:`runtime.options`, the parser presses share)."""

from __future__ import annotations

from runtime.errors import UsageError
from runtime.options import (
    build_with_options,
    check_name,
    held_as,
    register_in,
    shown_value,
    typed_options,
)
from runtime.plugins import load_plugin, plugin_names

from .adakv import AdaKVAllocator
from .base import Allocator, BudgetRequest, check_allocation, check_keep_fraction
from .flat import FlatAllocator
from .gate import GateAllocator
from .global_topk import GlobalAllocator
from .head_shares import HeadShares, HeadSharesAllocator
from .integerize import largest_remainder
from .per_layer import PerLayerAllocator
from .pyramid import PyramidAllocator

ALLOCATORS: dict[str, type[Allocator]] = {
    cls.name: cls
    for cls in (FlatAllocator, GateAllocator, PyramidAllocator, GlobalAllocator, AdaKVAllocator, PerLayerAllocator,
                HeadSharesAllocator)
}


def register(cls: type[Allocator]) -> type[Allocator]:
    """Add an allocator class to the registry under its ``name`` (a class decorator), as :func:`presses.register`
    adds a press: an allocator of one's own, in one's own module, runs wherever a registry name does (``bench
    compare``, :meth:`presses.Selection.plan`, the pipelines).

    Raises
    ------
    UsageError
        A class that is not an :class:`Allocator`, without a ``name``, or whose name is taken by another class.
    """
    return register_in(ALLOCATORS, cls, Allocator, "allocator")


def available() -> list[str]:
    """The allocators a name may give: the registry's, then those installed packages declare
    (:mod:`runtime.plugins`)."""
    return list(ALLOCATORS) + [name for name in plugin_names("allocator") if name not in ALLOCATORS]


def get(name: str, **kwargs) -> Allocator:
    """An allocator by registry name, its options typed by their fields (text such as ``"1/2/3"`` is parsed:
    :mod:`runtime.options`); a name that is not text, unknown names and options, and ill-typed values raise a
    :class:`~runtime.errors.UsageError` saying what is allowed."""
    check_name(name, ALLOCATORS, Allocator, "--alloc", "allocators.get", available())
    if isinstance(name, str):
        load_plugin("allocator", name, ALLOCATORS, register)
    if name not in ALLOCATORS:
        raise UsageError(f"unknown allocator {name!r}; available: {', '.join(ALLOCATORS)}")
    return build_with_options(ALLOCATORS[name], name, kwargs, "allocator")


def options_of(name: str, options: dict) -> dict:
    """``options`` of the allocator ``name`` as :func:`get` builds it with them: typed by its fields and read back
    from the built allocator, which holds one form of each setting (perlayer's ``weights=2/4`` is ``1/2``)."""
    built = get(name, **options)
    held = {key: getattr(built, key) for key in typed_options(ALLOCATORS[name], name, options)}
    for key, value in held.items():
        if not shown_value(value):  # a label shows it, and a setting's equality compares it (probe 22, #4)
            raise UsageError(f"allocator {name}: built, it holds {key} as {held_as(value)}, which no "
                             "label shows: have its __post_init__ keep a number, a text, or a list of numbers")
    try:  # what it holds, read as its options again: an integer held as 3.0 is no integer (probe 22, U1)
        typed_options(ALLOCATORS[name], name, held)
    except (UsageError, ValueError) as error:
        raise UsageError(f"allocator {name}: built, it holds values its options do not take ({error}): have its "
                         "__post_init__ keep each of its field's type") from None
    again = get(name, **held)  # a label shows what it holds, which must build the same (probe 23, #4)
    moved = next((key for key in held if getattr(again, key) != held[key]), None)
    if moved is not None:
        raise UsageError(f"allocator {name}: built from what it holds ({moved}={held[moved]!r}), it holds "
                         f"{moved}={getattr(again, moved)!r}: its __post_init__ changes its options again at each "
                         "build, so no label names its setting; make a build from its own values keep them")
    return held


__all__ = ["ALLOCATORS", "Allocator", "BudgetRequest", "HeadShares", "available", "check_allocation",
           "check_keep_fraction", "get", "largest_remainder", "options_of", "register"]

"""Allocator protocol: how many body entries each attention layer and KV head keeps for a kept fraction p."""

from __future__ import annotations

import numbers
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol

import torch

from runtime.errors import UsageError

from .integerize import round_half_up


def check_keep_fraction(p: float, what: str = "keep fraction") -> float:
    """``p`` as a float if it is a number (Python's or numpy's) in (0, 1]; else ``ValueError`` naming it."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise UsageError(f"{what} must be a number in (0, 1], got {p!r} ({type(p).__name__})")
    if not (0 < p <= 1):
        raise UsageError(f"{what} {p!r} is outside (0, 1]")
    return float(p)


class SharesByFraction(Protocol):
    """Shares of the budget per (attention layer, KV head) that depend on the kept fraction
    (:class:`allocators.head_shares.HeadShares`, which imports this module)."""

    def at(self, keep_fraction: float) -> dict[int, list[float]]:
        """``{layer: [share per KV head]}`` at ``keep_fraction``, summing to 1."""


@dataclass(frozen=True)
class BudgetRequest:
    """Everything an allocator may read.

    Attributes
    ----------
    keep_fraction : float
        p in (0, 1].
    n_body : int
        Context entries that may be evicted (n − prot).
    layers : tuple[int, ...]
        Attention layer indices, in depth order.
    num_kv_heads : int
    scores : dict[int, torch.Tensor] or None
        ``[H_kv, n_body]`` per layer, for allocators that look at scores (global top-B).
    layer_weights : dict[int, float] or None
        Calibrated per-layer weights (gate-proportional allocation).
    head_shares : SharesByFraction, dict[int, list[float]] or None
        Calibrated shares of the budget per layer and KV head (head_shares allocation): by kept fraction
        (:class:`allocators.head_shares.HeadShares`), or one ``{layer: [share per KV head]}`` set for every p.
    """

    keep_fraction: float
    n_body: int
    layers: tuple[int, ...]
    num_kv_heads: int
    scores: dict[int, torch.Tensor] | None = None
    layer_weights: dict[int, float] | None = None
    head_shares: SharesByFraction | dict[int, list[float]] | None = None

    def __post_init__(self):
        check_keep_fraction(self.keep_fraction)
        if self.n_body < 1:
            raise ValueError(f"n_body must be >= 1, got {self.n_body}")

    @property
    def per_head(self) -> int:
        """round(p · (n − prot)): the flat per-(layer, head) count."""
        return round_half_up(self.keep_fraction * self.n_body)

    @property
    def total(self) -> int:
        """The model-wide budget B = L_attn · H_kv · round(p · (n − prot)) of the paper's §2."""
        return len(self.layers) * self.num_kv_heads * self.per_head


class Allocator(ABC):
    """Integer counts per attention layer and KV head; they sum to :attr:`BudgetRequest.total` exactly."""

    name: str = ""
    #: the vLLM engine runs it (:mod:`serving.rules` reads this): every head of a layer keeps one count
    runs_in_engine: bool = False
    #: reads the press's scores (global, adakv)
    needs_scores: bool = False
    #: ranks scores of different layers against each other (global): only for presses whose scores share a scale
    compares_layers: bool = False
    #: reads calibrated per-layer weights (gate)
    needs_layer_weights: bool = False
    #: reads calibrated shares per (layer, KV head) (head_shares)
    needs_head_shares: bool = False
    #: files of the model directory that are this allocator's own calibration (globs): hashed into its rows' method
    #: code, not into the model's artifacts (:data:`pretrained.loading.METHOD_ARTIFACTS`), so that calibrating a new
    #: allocator for a model leaves every other method's rows where they are
    model_files: tuple[str, ...] = ()

    def check_layers(self, count: int) -> None:
        """``ValueError`` if this allocator cannot split a budget over ``count`` attention layers (its options
        name a per-layer value each); callable before any model loads. Any count by default."""

    @abstractmethod
    def allocate(self, request: BudgetRequest) -> dict[int, list[int]]:
        """``{layer: [count per KV head]}``."""


def _integer(count) -> bool:
    """Whether ``count`` is an integer count: Python's or numpy's ``int``, or a 0-dim integer tensor (never a bool)."""
    if isinstance(count, torch.Tensor):
        return count.dim() == 0 and not (count.dtype == torch.bool or count.is_floating_point() or count.is_complex())
    return isinstance(count, numbers.Integral) and not isinstance(count, bool)


def check_allocation(allocation, request: BudgetRequest, allocator: Allocator) -> dict[int, list[int]]:
    """``allocation`` as plain counts ``{layer: [count per KV head]}`` in ``request.layers``' order, each value read
    once; a :class:`~runtime.errors.UsageError` naming ``allocator`` and the first bad value unless it is that over
    exactly ``request.layers``, each ``num_kv_heads`` integers in ``[0, n_body]``, summing to ``request.total``.

    A user's allocator is code the bench runs: a malformed allocation ended in a ``KeyError`` or ``IndexError`` deep
    in the plan, or ran with counts as strings (probe 11), and a dict of its own that gave other counts each time
    they were read passed this check and was planned from with the later ones (probe 12); the plan reads only the
    copy returned."""
    layers, heads = list(request.layers), request.num_kv_heads
    wanted = (f"an allocator returns {{attention layer: [count per KV head]}} over the layers {layers}, each "
              f"{heads} integers in [0, {request.n_body}], summing to {request.total}")

    def refuse(problem: str):
        raise UsageError(f"allocator {allocator.name or type(allocator).__name__} returned {problem}; {wanted}")

    if not isinstance(allocation, dict):
        refuse(f"a {type(allocation).__name__}, not a dict")
    given = dict(allocation.items())
    for key in given:
        if not _integer(key) or isinstance(key, torch.Tensor) or key not in layers:
            refuse(f"the key {key!r} ({type(key).__name__}), not an attention layer")
    plain = {}
    for layer in layers:
        if layer not in given:
            refuse(f"no counts for attention layer {layer}")
        counts = given[layer]
        read = list(counts) if isinstance(counts, (list, tuple, torch.Tensor)) else None
        if read is None or len(read) != heads:
            refuse(f"{repr(counts) if read is None else f'{len(read)} counts'} for layer {layer}")
        for count in read:
            if not _integer(count) or not 0 <= int(count) <= request.n_body:
                refuse(f"the count {count!r} ({type(count).__name__}) for layer {layer}")
        plain[layer] = [int(count) for count in read]
    total = sum(sum(counts) for counts in plain.values())
    if total != request.total:
        refuse(f"counts summing to {total}")
    return plain

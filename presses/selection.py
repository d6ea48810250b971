"""Scores + counts -> keep plan -> compacted child: the one selection every (press, allocator) pair shares.

A :class:`Selection` scores a parent with one press once and forks children for any (allocator, kept fraction);
``bench compare``, ``bench cost`` and :func:`compress` all go through it.
"""

from __future__ import annotations

import copy
import math
import numbers
import time

import torch

import allocators
from allocators import Allocator, BudgetRequest, HeadShares, check_allocation, check_keep_fraction
from pretrained.model_info import ModelInfo, model_of
from runtime import Child, KeepPlan, Parent
from runtime.errors import ArgumentTypeError, ReleasedError, UsageError, describe
from runtime.user_code import is_users, run_users

from .base import Press, Scores, ScoringContext
from .calibration import Calibration, head_shares_for
from .context_guard import Fingerprint, check_unchanged, fingerprint
from .gatesight import GateSightPress
from .preparation import prepare, press_call
from .registry import PRESSES, available
from .score_check import check_scores, plain_mapping, press_label


def keep_fraction_from(keep_fraction: float | None, compression_ratio: float | None) -> float:
    """Accept either the kept fraction p or kvpress's ``compression_ratio`` = 1 − p (exactly one); a
    :class:`~runtime.errors.UsageError` naming the value otherwise, as :func:`allocators.check_keep_fraction`'s."""
    if (keep_fraction is None) == (compression_ratio is None):
        raise UsageError("give exactly one of keep_fraction (p) or compression_ratio (1 - p)")
    if keep_fraction is not None:
        return check_keep_fraction(keep_fraction)
    if isinstance(compression_ratio, bool) or not isinstance(compression_ratio, numbers.Real):
        raise UsageError(f"compression_ratio must be a number in [0, 1), got {compression_ratio!r} "
                         f"({type(compression_ratio).__name__})")
    if not 0 <= compression_ratio < 1:
        raise UsageError(f"compression_ratio {compression_ratio!r} is outside [0, 1) (it is 1 - kept fraction)")
    return 1.0 - float(compression_ratio)


def check_press(press) -> None:
    """Refuse a ``press`` that is neither a :class:`Press` nor a registry name, naming what is allowed."""
    if not isinstance(press, (Press, str)):
        raise ArgumentTypeError(f"press must be a Press instance or a press name ({', '.join(available())}), got "
                                f"{describe(press)}")


def allocator_of(allocator: Allocator | str) -> Allocator:
    """``allocator`` itself, or the registry's allocator of that name; anything else is refused naming what is
    allowed."""
    if isinstance(allocator, str):
        return allocators.get(allocator)
    if not isinstance(allocator, Allocator):
        raise ArgumentTypeError(f"allocator must be an Allocator instance or an allocator name "
                                f"({', '.join(allocators.available())}), got {describe(allocator)}")
    return allocator


def check_parent(parent) -> None:
    """Refuse a ``parent`` a :class:`Selection` cannot score, naming what is allowed: anything but a
    :class:`~runtime.Parent` or another :class:`~presses.base.ScoringContext` (the served context inside vLLM), and a
    :class:`~runtime.Child`, which holds no evidence and is compacted already."""
    if isinstance(parent, Child):
        raise ArgumentTypeError("parent must be a runtime.Parent (the cache prefill returns), got a Child: a Child "
                                "cannot be compressed again; compress the parent it was forked from at the kept "
                                "fraction wanted")
    if not isinstance(parent, Parent) and not all(hasattr(parent, name) for name in ScoringContext.__annotations__):
        raise ArgumentTypeError(f"parent must be a runtime.Parent (the cache prefill returns), got "
                                f"{describe(parent)}")


def check_layer_weights(layer_weights, layers: tuple[int, ...] | None = None) -> None:
    """Refuse ``layer_weights`` that are neither None nor a dict (a list would read as weights by position, where
    the allocators look them up by attention layer), a key that is not an integer or, given the model's attention
    ``layers``, not one of them, and a weight that is not a finite number >= 0, naming it and what is allowed."""
    if layer_weights is not None and not isinstance(layer_weights, dict):
        raise ArgumentTypeError(f"layer_weights must be a dict {{attention layer: weight}} or None, got "
                                f"{describe(layer_weights)}")
    keys = [key for key in layer_weights or {} if isinstance(key, bool) or not isinstance(key, numbers.Integral)]
    if keys:
        raise ArgumentTypeError(f"layer_weights must be keyed by attention layer index (an integer, e.g. {{3: 1.0}}), "
                                f"got the key {keys[0]!r}")
    for layer, weight in (layer_weights or {}).items():
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
            raise ArgumentTypeError(f"layer_weights[{layer}] must be a number >= 0, got {describe(weight)}")
        if not math.isfinite(weight) or weight < 0:
            raise UsageError(f"layer_weights[{layer}] = {weight!r}: a layer's weight must be a finite number >= 0 "
                             "(its share of the budget)")
    others = sorted(set(layer_weights or {}) - set(layers)) if layers is not None else []
    if others:
        raise UsageError(f"layer_weights name layers {others} that are not attention layers of this model (its "
                         f"attention layers: {', '.join(map(str, layers))})")


def check_layer_weights_read(layer_weights, allocator: Allocator | None) -> None:
    """Refuse ``layer_weights`` that ``allocator`` would ignore (one that does not read them, or None: nothing is
    compressed), naming the allocators that read them."""
    if layer_weights is None or (allocator is not None and allocator.needs_layer_weights):
        return
    readers = [name for name, cls in allocators.ALLOCATORS.items() if cls.needs_layer_weights]
    which = "no allocator (nothing is compressed)" if allocator is None else f"the {allocator.name!r} allocator"
    raise UsageError(f"layer_weights would be ignored: {which} does not read them; they split the budget across "
                     f"layers for the allocators {', '.join(readers)}: leave them out, or use one of those")


def check_pair(press: Press, allocator: Allocator) -> None:
    """Refuse combinations that are not meaningful before any work starts (a press bound already: GateSight's scale
    is its estimator's)."""
    if allocator.compares_layers and not press.comparable_scale:
        comparable = [name for name, cls in PRESSES.items() if cls.comparable_scale]  # as each press declares
        shown = run_users(getattr, type(press), f"press {press_label(press)}", "in shown_name", press, "shown_name")
        remedy = ""
        if isinstance(press, GateSightPress):  # on one scale with an estimator trained on one
            has = "none" if press.estimator is None else f"one trained on scale {press.estimator.scale!r}"
            remedy = (f", or GateSight with an estimator trained on one scale (it has {has}): `bench train --scale "
                      "one`, into the model's gatesight/ or a directory given as gatesight[estimator=DIR]")
        raise UsageError(
            f"the {allocator.name!r} allocator ranks scores across layers, but {shown} scores each layer "
            "on a scale of its own (a top-B over layers would keep whichever layer's scale runs highest); use it "
            f"with a press whose scores share one scale: {', '.join(comparable)}{remedy}"
        )


def check_evidence(parent: Parent, press: Press) -> None:
    """``ValueError`` naming what ``press`` reads that ``parent`` was prefilled without (or that it was released)."""
    parent.kv  # noqa: B018 - a released parent says so, rather than that its evidence is missing
    adapter, recorded = parent.adapter, parent.evidence
    wanted = press_call(press, "evidence", adapter, model=adapter.model)
    missing = []
    if wanted.window and not all(layer in recorded.window_hidden for layer in adapter.attention_layers):
        missing.append(f"the attention layers' inputs of the last {min(wanted.window, parent.n)} context tokens")
    if wanted.recurrent_signals and adapter.recurrent_layers and not recorded.recurrent_signals:
        missing.append("the recurrent layers' signals")
    if missing:
        raise ValueError(f"press {press_label(press)} reads {' and '.join(missing)}, which this parent was prefilled "
                         "without: pass evidence=press.evidence(adapter) to prefill")


class Selection:
    """One press's scores for one parent, computed once, and the children of any (allocator, kept fraction).

    Parameters
    ----------
    parent : Parent
        Prefilled with the evidence ``press`` asks for (or another :class:`~presses.base.ScoringContext`, scored but
        not forked: the served context inside vLLM); a :class:`~runtime.Child` is refused.
    press : Press or str
        Bound to the model's directory here if it reads artifacts from it (:meth:`Press.bind`).
    layer_weights : dict[int, float], optional
        For allocators that read them (``needs_layer_weights``); default: the model's calibration.
    model : ModelInfo, optional
        The model as read once (:func:`pretrained.model_info.read`), which the press is bound to and the calibration
        and head shares are checked against; default: the directory the parent's model was loaded from, read here.
    """

    def __init__(self, parent: Parent, press: Press | str, layer_weights: dict[int, float] | None = None,
                 model: ModelInfo | None = None):
        check_parent(parent)
        check_press(press)
        check_layer_weights(layer_weights, tuple(parent.adapter.attention_layers))
        self.parent = parent
        self.model = model if model is not None else model_of(parent.adapter)
        self.press = prepare(press, parent.adapter, self.model)
        check_evidence(parent, self.press)
        self.layer_weights = layer_weights
        # read from the model directory when first needed
        self.head_shares: HeadShares | dict[int, list[float]] | None = None
        self._scores: Scores | None = None
        self.score_seconds: float | None = None
        self.fingerprinted: Fingerprint | None = None
        """The parent's fingerprint (:func:`~presses.context_guard.fingerprint`) once scored; before, where the
        caller sets it, what the parent is known to be as scoring starts (another press's, just scored: one pass
        over the cache saved)."""

    @property
    def scores(self) -> Scores:
        """``[H_kv, n_body]`` per attention layer, computed on first use (timed in :attr:`score_seconds`)."""
        if self._scores is None:
            if getattr(self.parent, "released", False):  # its evidence went with it: say that, not what it lacks
                raise ReleasedError("this parent was released, its cache and evidence with it: prefill the context "
                                    "again")
            shown = f"press {press_label(self.press)}"
            # what every press must leave as it found it, the project's own too (probe 13: a press added as a file
            # of presses/ is as new as a user's)
            before = self.fingerprinted or fingerprint(self.parent)

            def score() -> Scores:  # timed alone, without the checks around it
                t0 = time.perf_counter()
                # read once into a plain dict inside the user's call: a dict of its own may give other values (or
                # raise) each time it is read, after the check (probe 12)
                scores = plain_mapping(self.press.score(self.parent))
                self.score_seconds = time.perf_counter() - t0
                return scores

            scores = run_users(score, type(self.press), shown, "in score", model=_model_of(self.parent))
            self.fingerprinted = fingerprint(self.parent)
            check_unchanged(before, self.fingerprinted, shown)
            self._scores = check_scores(scores, self.parent, self.press, self.model)  # keyed by plain ints
        return self._scores

    def plan(self, allocator: Allocator | str, keep_fraction: float) -> KeepPlan:
        """The keep plan of ``allocator``'s counts filled with each head's top-scoring body entries."""
        allocator, keep_fraction = allocator_of(allocator), check_keep_fraction(keep_fraction)  # before scoring
        check_pair(self.press, allocator)
        weights = self.layer_weights
        if allocator.needs_layer_weights and weights is None:
            weights = self.layer_weights = Calibration.for_model(self.parent.adapter, self.model).gate_weights
        if allocator.needs_head_shares and self.head_shares is None:
            self.head_shares = head_shares_for(self.parent.adapter, self.model)
        # scores checked when computed
        return _fill(self.parent, self.scores, allocator, keep_fraction, weights, self.head_shares)

    def fork(self, allocator: Allocator | str, keep_fraction: float) -> Child:
        """The compacted child of :meth:`plan`."""
        return self.parent.fork(self.plan(allocator, keep_fraction))


def _model_of(context) -> torch.nn.Module | None:
    """The torch module ``context`` is of (a served context's adapter may hold none)."""
    model = getattr(getattr(context, "adapter", None), "model", None)
    return model if isinstance(model, torch.nn.Module) else None


def _fill(parent: Parent, scores: Scores, allocator: Allocator, keep_fraction: float,
          layer_weights: dict[int, float] | None,
          head_shares: HeadShares | dict[int, list[float]] | None = None) -> KeepPlan:
    adapter = parent.adapter
    read = (scores if allocator.needs_scores else None, layer_weights,
            head_shares if allocator.needs_head_shares else None)
    if is_users(type(allocator)):
        # its own copies: the press's scores, the weights and the shares are computed once and read by every
        # allocator of the run after it, whose rows one changing them in place corrupted (probe 12: ``neg_()``); the
        # scores are [H_kv, n_body] per layer, small beside the cache, and the others smaller still
        read = copy.deepcopy(read)
    request = BudgetRequest(
        keep_fraction=keep_fraction,  # BudgetRequest refuses a fraction outside (0, 1]
        n_body=parent.n - parent.protected,
        layers=adapter.attention_layers,
        num_kv_heads=adapter.geometry.num_kv_heads,
        scores=read[0],
        layer_weights=read[1],
        head_shares=read[2],
    )
    shown = f"allocator {allocator.name or type(allocator).__name__}"
    # checked inside the user's call, which reads the allocation once into the plain counts planned from (a dict or
    # list of its own may give other values each time it is read, or raise: probe 12)
    # the request holds no model: its modules are checked around the calls given it, and once per context
    allocation = run_users(lambda: check_allocation(allocator.allocate(request), request, allocator),
                           type(allocator), shown, "in allocate")
    return KeepPlan.from_scores(scores, allocation, parent.protected)


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
    check_parent(parent)
    p = keep_fraction_from(keep_fraction, compression_ratio)
    check_press(press)
    check_layer_weights(layer_weights, tuple(parent.adapter.attention_layers))
    allocator = allocator_of(allocator)  # before the press is prepared: every bad argument is refused before work
    check_layer_weights_read(layer_weights, allocator)
    return Selection(parent, press, layer_weights).fork(allocator, p)

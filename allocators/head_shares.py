"""Static head shares: each (attention layer, KV head) keeps a fixed share of the model-wide budget B.

The shares are calibrated once per model (``bench calibrate-shares``: KVzip's global top-B allocations on
calibration windows of training text, averaged over windows at each kept fraction p of a grid) and shipped in the
model directory as :data:`FILE`. Which heads need the budget changes with p (at a small p a few heads hold what
matters; at a large one those heads reach their whole body and the rest spreads out), so at a p between two
calibrated fractions the shares are interpolated linearly between theirs, and outside the grid the nearest
fraction's are used. At serving they cost nothing: head (ℓ, h) keeps round(B · s_ℓh(p)), integerised by largest
remainder so that the counts sum to B exactly, each capped at the body with the excess re-spread over the other
heads in proportion to their shares.
"""

from __future__ import annotations

import bisect
import json
import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path

from runtime.bounded_read import METADATA_LIMIT, read_text_bounded
from runtime.errors import UsageError, check_regular_file, link_target, missing_file
from runtime.json_text import parse_json

from .base import Allocator, BudgetRequest
from .integerize import largest_remainder

FILE = Path("calibration") / "head_shares.json"
"""Where a model directory holds its head shares, beside the calibration (a JSON file: no engine loads it as a
weight shard)."""
FORMAT = "hybridpress head shares 2"
"""Shares by kept fraction: ``{"by_keep_fraction": {p: {layer: [share per KV head]}}}``."""
FORMAT_ONE_SET = "hybridpress head shares 1"
"""One set of shares for every kept fraction: ``{"shares": {layer: [share per KV head]}}`` (still read)."""

Shares = dict[int, list[float]]


@dataclass
class HeadShares:
    """Calibrated shares of the budget per (attention layer, KV head), at each calibrated kept fraction.

    Attributes
    ----------
    by_fraction : dict[float, dict[int, list[float]]]
        ``{p: {layer: [share per KV head]}}``, p in (0, 1] ascending; each set non-negative, summing to 1 over
        every (layer, head), all sets over the same layers and heads. One set is the shares at every p.
    provenance : dict
        What they were calibrated from: the press and allocator, the keep fractions, the text sources, the
        number of windows and their tokens, the per-window stability (JSON-serialisable).
    weights : str or None
        The fingerprint of the model weights they were measured on (``presses.calibration.weights_fingerprint``).
    """

    by_fraction: dict[float, Shares]
    provenance: dict = field(default_factory=dict)
    weights: str | None = None

    def __post_init__(self):
        self.by_fraction = _checked_grid(self.by_fraction, "head shares")

    @classmethod
    def of(cls, shares: HeadShares | Shares) -> HeadShares:
        """``shares`` as head shares: a ``{layer: [share per KV head]}`` mapping is one set for every p."""
        return shares if isinstance(shares, HeadShares) else cls({1.0: shares})

    def at(self, keep_fraction: float) -> Shares:
        """``{layer: [share per KV head]}`` at ``keep_fraction``: linear between the two calibrated fractions around
        it, the nearest one's outside the grid; summing to 1."""
        grid = sorted(self.by_fraction)
        i = bisect.bisect_left(grid, keep_fraction)
        if i == 0 or i == len(grid):
            return self.by_fraction[grid[min(i, len(grid) - 1)]]
        low, high = grid[i - 1], grid[i]
        t = (keep_fraction - low) / (high - low)
        below, above = self.by_fraction[low], self.by_fraction[high]
        return {layer: [(1 - t) * a + t * b for a, b in zip(below[layer], above[layer])] for layer in below}

    def check(self, layers: tuple[int, ...], num_kv_heads: int, shown: str = "head shares") -> None:
        """``UsageError`` unless there is one share per KV head for exactly the attention ``layers``."""
        shares = next(iter(self.by_fraction.values()))  # every set covers the same heads (checked when made)
        if sorted(shares) != sorted(layers):
            raise UsageError(f"{shown} cover attention layers {sorted(shares)}; the model's are {list(layers)}: "
                             "calibrate them on this model (`bench calibrate-shares --model PATH`)")
        wrong = [layer for layer, heads in shares.items() if len(heads) != num_kv_heads]
        if wrong:
            raise UsageError(f"{shown} give layer {wrong[0]} {len(shares[wrong[0]])} heads; the model has "
                             f"{num_kv_heads} KV heads per layer")

    def save(self, directory) -> Path:
        """Write :data:`FILE` under ``directory`` and return its path."""
        path = Path(directory) / FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        grid = {str(p): {str(layer): heads for layer, heads in sorted(shares.items())}
                for p, shares in sorted(self.by_fraction.items())}
        record = {"format": FORMAT, "weights": self.weights, "provenance": self.provenance, "by_keep_fraction": grid}
        path.write_text(json.dumps(record, indent=1) + "\n")
        return path

    @classmethod
    def load(cls, directory) -> HeadShares:
        """The shares of a model ``directory``; a ``UsageError`` in one line if they are missing or damaged."""
        path = Path(directory) / FILE
        check_regular_file(path, "head shares (JSON)")
        if link_target(path) is not None and not path.exists():  # calibrate-shares refuses to write through it
            raise UsageError(f"{path.parent}: {missing_file(path)}; remove the link, then run `bench "
                             f"calibrate-shares --model {directory}`")
        if not path.exists():
            raise UsageError(f"no head shares at {path}: run `bench calibrate-shares --model {directory}`")
        try:
            record = parse_json(read_text_bounded(path, METADATA_LIMIT, f"run `bench calibrate-shares --model "
                                                                        f"{directory} --replace`"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise UsageError(f"{path}: not valid JSON ({error}); run `bench calibrate-shares --model {directory} "
                             "--replace`") from None
        if not isinstance(record, dict) or record.get("format") not in (FORMAT, FORMAT_ONE_SET):
            raise UsageError(f"{path}: not a head-shares file (a JSON object with format {FORMAT!r} and "
                             "by_keep_fraction {p: {layer: [share per KV head]}})")
        if record["format"] == FORMAT_ONE_SET:
            grid = {"1.0": record.get("shares")}
        else:
            grid = record.get("by_keep_fraction")
            if not isinstance(grid, dict) or not grid:
                raise UsageError(f"{path}: by_keep_fraction must map kept fractions to shares, got {grid!r}")
        grid = _checked_grid(_unique({p: _keyed(shares, path) for p, shares in grid.items()}, _fraction, path,
                                     "kept fraction"), str(path))
        weights = record.get("weights")
        if not isinstance(weights, str):
            # without it shares of another model's weights would plan this one's children unseen
            raise UsageError(f"{path}: weights={weights!r}, expected the fingerprint of the model weights the shares "
                             f"were measured on; run `bench calibrate-shares --model {directory} --replace`")
        return cls(grid, record.get("provenance") or {}, weights)


def _fraction(text: str, path: Path) -> float:
    try:
        p = float(text)
    except ValueError:
        p = math.nan
    if not 0 < p <= 1:
        raise UsageError(f"{path}: shares are keyed by kept fraction p in (0, 1], got {text!r}")
    return p


def _keyed(shares, path: Path) -> Shares:
    if not isinstance(shares, dict):
        raise UsageError(f"{path}: give shares as {{layer: [share per KV head]}}, got {shares!r}")
    return _unique(shares, _layer, path, "attention layer")


def _layer(text: str, path: Path) -> int:
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{path}: shares must be keyed by attention layer index, got {text!r}") from None


def _unique(keyed: dict, parse, path: Path, what: str) -> dict:
    """``keyed`` with each key parsed (``parse(key, path)``); a ``UsageError`` naming two keys that are one value
    written two ways (``"0.5"`` and ``"0.50"``, ``"3"`` and ``"03"``): one would silently replace the other."""
    out, spelled = {}, {}
    for key, value in keyed.items():
        parsed = parse(key, path)
        if parsed in out:
            raise UsageError(f"{path}: the keys {spelled[parsed]!r} and {key!r} are one {what} written two ways; keep "
                             "one of them")
        out[parsed], spelled[parsed] = value, key
    return out


def _checked_grid(grid, shown: str) -> dict[float, Shares]:
    """``grid`` with each set checked (:func:`_checked`) and over the same heads, fractions ascending."""
    if not isinstance(grid, dict) or not grid:
        raise UsageError(f"{shown}: give {{kept fraction: {{attention layer: [share per KV head]}}}}, got {grid!r}")
    out = {}
    for p, shares in sorted(grid.items()):
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 < p <= 1:
            raise UsageError(f"{shown}: shares are keyed by kept fraction p in (0, 1], got {p!r}")
        out[float(p)] = _checked(shares, f"{shown} at p = {p}" if len(grid) > 1 else shown)
    first, *rest = out.values()
    for p, shares in out.items():
        if {layer: len(heads) for layer, heads in shares.items()} != {layer: len(h) for layer, h in first.items()}:
            raise UsageError(f"{shown}: the shares at p = {p} cover other layers or heads than at p = {min(out)}")
    return out


def _checked(shares, shown: str) -> Shares:
    """``shares`` as floats normalised to sum 1; a ``UsageError`` naming the first bad value."""
    if not isinstance(shares, dict) or not shares:
        raise UsageError(f"{shown}: give {{attention layer: [share per KV head]}}, got {shares!r}")
    out = {}
    for layer, heads in shares.items():
        if not isinstance(heads, (list, tuple)) or not heads:
            raise UsageError(f"{shown}: layer {layer} must hold a list of shares (one per KV head), got {heads!r}")
        out[int(layer)] = [_share(share, layer, shown) for share in heads]
    total = sum(s for heads in out.values() for s in heads)
    if math.isinf(total):  # shares each finite can sum past the largest float: scaled down first, as sum 1 is wanted
        largest = max(s for heads in out.values() for s in heads)
        out = {layer: [s / largest for s in heads] for layer, heads in out.items()}
        total = sum(s for heads in out.values() for s in heads)
    if total <= 0:
        raise UsageError(f"{shown}: every share is 0; at least one head must keep a positive share")
    return {layer: [s / total for s in heads] for layer, heads in sorted(out.items())}


def _share(share, layer, shown: str) -> float:
    """``share`` as a float; a ``UsageError`` unless it is a finite number >= 0 (an integer past the largest float
    too, which ``float`` cannot hold)."""
    if isinstance(share, bool) or not isinstance(share, numbers.Real):
        value = math.nan
    else:
        try:
            value = float(share)
        except OverflowError:
            raise UsageError(f"{shown}: layer {layer} has a share of {len(str(abs(share)))} digits, past the largest "
                             "float; a share is a finite number >= 0 (only ratios matter: scale them down)") from None
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{shown}: layer {layer} has the share {share!r}; a share is a finite number >= 0")
    return value


@dataclass
class HeadSharesAllocator(Allocator):
    name = "head_shares"
    needs_head_shares = True
    model_files = (FILE.as_posix(),)

    def allocate(self, request: BudgetRequest) -> dict[int, list[int]]:
        if request.head_shares is None:
            raise UsageError("the head_shares allocator needs the model's calibrated head shares: run "
                             "`bench calibrate-shares --model PATH`")
        shares = HeadShares.of(request.head_shares)
        shares.check(request.layers, request.num_kv_heads)
        at_p = shares.at(request.keep_fraction)
        flat = [at_p[layer][h] for layer in request.layers for h in range(request.num_kv_heads)]
        counts = largest_remainder([request.total * s for s in flat], request.total, 0, request.n_body)
        heads = request.num_kv_heads
        return {layer: counts[i * heads : (i + 1) * heads] for i, layer in enumerate(request.layers)}

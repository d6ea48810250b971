"""Static head shares: each (attention layer, KV head) keeps a fixed share of the model-wide budget B.

The shares are calibrated once per model (``bench calibrate-shares``: KVzip's global top-B allocations on
calibration windows of training text, averaged) and shipped in the model directory as :data:`FILE`. At serving
they cost nothing: head (ℓ, h) keeps round(B · s_ℓh), integerised by largest remainder so that the counts sum to B
exactly, each capped at the body with the excess re-spread over the other heads in proportion to their shares.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path

from runtime.errors import UsageError, check_regular_file
from runtime.json_text import parse_json

from .base import Allocator, BudgetRequest
from .integerize import largest_remainder

FILE = Path("calibration") / "head_shares.json"
"""Where a model directory holds its head shares, beside the calibration (a JSON file: no engine loads it as a
weight shard)."""
FORMAT = "hybridpress head shares 1"


@dataclass
class HeadShares:
    """Calibrated shares of the budget per (attention layer, KV head).

    Attributes
    ----------
    shares : dict[int, list[float]]
        ``{layer: [share per KV head]}``, non-negative, summing to 1 over every (layer, head).
    provenance : dict
        What they were calibrated from: the press and allocator, the keep fractions, the text sources, the
        number of windows and their tokens, the per-window stability (JSON-serialisable).
    weights : str or None
        The fingerprint of the model weights they were measured on (``presses.calibration.weights_fingerprint``).
    """

    shares: dict[int, list[float]]
    provenance: dict = field(default_factory=dict)
    weights: str | None = None

    def __post_init__(self):
        self.shares = _checked(self.shares, "head shares")

    def check(self, layers: tuple[int, ...], num_kv_heads: int, shown: str = "head shares") -> None:
        """``UsageError`` unless there is one share per KV head for exactly the attention ``layers``."""
        if sorted(self.shares) != sorted(layers):
            raise UsageError(f"{shown} cover attention layers {sorted(self.shares)}; the model's are {list(layers)}: "
                             "calibrate them on this model (`bench calibrate-shares --model PATH`)")
        wrong = [layer for layer, heads in self.shares.items() if len(heads) != num_kv_heads]
        if wrong:
            raise UsageError(f"{shown} give layer {wrong[0]} {len(self.shares[wrong[0]])} heads; the model has "
                             f"{num_kv_heads} KV heads per layer")

    def save(self, directory) -> Path:
        """Write :data:`FILE` under ``directory`` and return its path."""
        path = Path(directory) / FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"format": FORMAT, "weights": self.weights, "provenance": self.provenance,
                  "shares": {str(layer): heads for layer, heads in sorted(self.shares.items())}}
        path.write_text(json.dumps(record, indent=1) + "\n")
        return path

    @classmethod
    def load(cls, directory) -> HeadShares:
        """The shares of a model ``directory``; a ``UsageError`` in one line if they are missing or damaged."""
        path = Path(directory) / FILE
        check_regular_file(path, "head shares (JSON)")
        if not path.exists():
            raise UsageError(f"no head shares at {path}: run `bench calibrate-shares --model {directory}`")
        try:
            record = parse_json(path.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise UsageError(f"{path}: not valid JSON ({error}); run `bench calibrate-shares --model {directory} "
                             "--replace`") from None
        if not isinstance(record, dict) or record.get("format") != FORMAT or not isinstance(record.get("shares"), dict):
            raise UsageError(f"{path}: not a head-shares file (a JSON object with format {FORMAT!r} and shares "
                             "{layer: [share per KV head]})")
        try:
            shares = {int(layer): heads for layer, heads in record["shares"].items()}
        except ValueError:
            raise UsageError(f"{path}: shares must be keyed by attention layer index, got "
                             f"{sorted(record['shares'])}") from None
        shares = _checked(shares, str(path))
        weights = record.get("weights")
        if not isinstance(weights, str):
            # without it shares of another model's weights would plan this one's children unseen
            raise UsageError(f"{path}: weights={weights!r}, expected the fingerprint of the model weights the shares "
                             f"were measured on; run `bench calibrate-shares --model {directory} --replace`")
        return cls(shares, record.get("provenance") or {}, weights)


def _checked(shares, shown: str) -> dict[int, list[float]]:
    """``shares`` as floats normalised to sum 1; a ``UsageError`` naming the first bad value."""
    if not isinstance(shares, dict) or not shares:
        raise UsageError(f"{shown}: give {{attention layer: [share per KV head]}}, got {shares!r}")
    out = {}
    for layer, heads in shares.items():
        if not isinstance(heads, (list, tuple)) or not heads:
            raise UsageError(f"{shown}: layer {layer} must hold a list of shares (one per KV head), got {heads!r}")
        for share in heads:
            if isinstance(share, bool) or not isinstance(share, numbers.Real) or not math.isfinite(share) or share < 0:
                raise UsageError(f"{shown}: layer {layer} has the share {share!r}; a share is a finite number >= 0")
        out[int(layer)] = [float(s) for s in heads]
    total = sum(s for heads in out.values() for s in heads)
    if total <= 0:
        raise UsageError(f"{shown}: every share is 0; at least one head must keep a positive share")
    return {layer: [s / total for s in heads] for layer, heads in sorted(out.items())}


@dataclass
class HeadSharesAllocator(Allocator):
    name = "head_shares"
    needs_head_shares = True
    model_files = (FILE.as_posix(),)

    def allocate(self, request: BudgetRequest) -> dict[int, list[int]]:
        if request.head_shares is None:
            raise UsageError("the head_shares allocator needs the model's calibrated head shares: run "
                             "`bench calibrate-shares --model PATH`")
        shares = HeadShares(request.head_shares)
        shares.check(request.layers, request.num_kv_heads)
        flat = [shares.shares[layer][h] for layer in request.layers for h in range(request.num_kv_heads)]
        counts = largest_remainder([request.total * s for s in flat], request.total, 0, request.n_body)
        heads = request.num_kv_heads
        return {layer: counts[i * heads : (i + 1) * heads] for i, layer in enumerate(request.layers)}

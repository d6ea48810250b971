"""Keep plans: which body entries each attention layer and KV head keeps."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import ArgumentTypeError, UsageError, describe
from .options import whole


@dataclass
class KeepPlan:
    """Kept body positions per attention layer and KV head.

    Attributes
    ----------
    layers : dict[int, list[torch.Tensor]]
        For every attention layer index, one sorted ``[k_h]`` long tensor of absolute context positions in
        ``[protected, n)`` per KV head. The protected prefix ``[0, protected)`` is kept in addition and never
        listed. Heads of one layer may keep different counts.
    """

    layers: dict[int, list[torch.Tensor]]

    def __post_init__(self):
        # accept any integer sequence per head (lists, numpy arrays, tensors); floats are refused, not truncated
        if not isinstance(self.layers, dict):
            raise ArgumentTypeError(f"KeepPlan takes {{attention layer: [positions per KV head]}}, got "
                                    f"{describe(self.layers)}")
        layers = {}
        for layer, heads in self.layers.items():
            if not isinstance(heads, (list, tuple)):
                raise ArgumentTypeError(f"keep plan layer {layer}: expected a list of kept positions per KV head, got "
                                        f"{describe(heads)}")
            converted = []
            for h, positions in enumerate(heads):
                try:
                    if isinstance(positions, (str, bytes)):
                        raise TypeError
                    positions = torch.as_tensor(positions)
                except (TypeError, ValueError, RuntimeError):
                    raise ArgumentTypeError(f"keep plan layer {layer} head {h}: positions must be integers, got "
                                            f"{describe(positions)}") from None
                if positions.numel() == 0:
                    positions = positions.long()
                elif positions.dtype.is_floating_point or positions.dtype.is_complex or positions.dtype == torch.bool:
                    raise ValueError(f"keep plan layer {layer} head {h}: positions must be integers, "
                                     f"got {positions.dtype}")
                converted.append(positions.long().reshape(-1) if positions.dim() == 0 else positions.long())
            layers[layer] = converted
        self.layers = layers

    @classmethod
    def keep_all(cls, n: int, protected: int, attention_layers, num_kv_heads: int) -> "KeepPlan":
        """Every body entry ``[protected, n)`` in every KV head of every attention layer."""
        n = whole(n, "n (the context's tokens)", 1, text=False)
        protected = whole(protected, "protected", 0, text=False)
        whole(num_kv_heads, "num_kv_heads", 1, text=False)
        if protected >= n:
            raise UsageError(f"protected={protected} is not allowed: it must be in [0, n - 1] = [0, {n - 1}] "
                             "(a keep plan keeps the body after the protected prefix)")
        body = torch.arange(protected, n)
        return cls({layer: [body.clone() for _ in range(num_kv_heads)] for layer in attention_layers})

    @classmethod
    def from_scores(cls, scores: dict[int, torch.Tensor], counts: dict[int, list[int]], protected: int) -> "KeepPlan":
        """Top-``counts[layer][h]`` body entries of every head by score (ties: lower position first).

        Parameters
        ----------
        scores : dict[int, torch.Tensor]
            ``[H_kv, n_body]`` per attention layer, higher = keep.
        counts : dict[int, list[int]]
            Entries to keep per layer and KV head, each in ``[0, n_body]``.
        protected : int
            Length of the protected prefix; body index ``j`` is context position ``protected + j``.
        """
        layers = {}
        for layer, layer_scores in scores.items():
            heads = []
            for h, count in enumerate(counts[layer]):
                # stable sort on -score keeps the earlier position on ties, deterministically
                order = torch.sort(-layer_scores[h].float(), stable=True).indices[: int(count)]
                heads.append(torch.sort(order).values + protected)
            layers[layer] = heads
        return cls(layers)

    def counts(self) -> dict[int, list[int]]:
        return {layer: [int(p.numel()) for p in heads] for layer, heads in self.layers.items()}

    def total(self) -> int:
        """Kept body entries summed over layers and heads (the budget B of the paper's §2)."""
        return sum(sum(c) for c in self.counts().values())

    def validate(self, n: int, protected: int, attention_layers, num_kv_heads: int) -> None:
        """Raise ``ValueError`` naming the first bad layer, head or position."""
        if set(self.layers) != set(attention_layers):
            raise ValueError(
                f"keep plan covers layers {sorted(self.layers)}; "
                f"the model's attention layers are {list(attention_layers)}"
            )
        for layer, heads in self.layers.items():
            if len(heads) != num_kv_heads:
                raise ValueError(f"keep plan layer {layer} has {len(heads)} heads; "
                                 f"the model has {num_kv_heads} KV heads")
            for h, positions in enumerate(heads):
                if positions.dtype not in (torch.int64, torch.int32) or positions.dim() != 1:
                    raise ValueError(f"keep plan layer {layer} head {h}: expected a 1-D integer tensor of positions")
                if positions.numel() == 0:
                    continue
                low, high = int(positions.min()), int(positions.max())
                if low < protected or high >= n:
                    raise ValueError(
                        f"keep plan layer {layer} head {h}: position {low if low < protected else high} is outside "
                        f"the body [{protected}, {n})"
                    )
                if positions.numel() > 1 and not bool((positions[1:] > positions[:-1]).all()):
                    raise ValueError(
                        f"keep plan layer {layer} head {h}: positions must be strictly increasing (no duplicates)"
                    )

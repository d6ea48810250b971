"""Evidence that presses declare and the single prefill captures; nothing is recorded unless asked for."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .errors import ArgumentTypeError
from .options import whole


@dataclass(frozen=True)
class EvidenceRequest:
    """What a press needs from prefill besides the attention KV cache (always kept).

    Attributes
    ----------
    recurrent_signals : bool
        Per GDN layer, token and value head: (β, g, ‖v‖) exactly as handed to the delta rule; per Mamba2 layer,
        token and head their analogues (Δ·‖B‖, A·Δ, ‖x‖) as the scan consumes them (the adapter's
        ``signal_layers``).
    signal_dtype : torch.dtype or None
        How the GDN signals are stored: float32 (12 bytes per token, GDN layer and value head; the default) or a
        16-bit type (half of that; ``benchmarks/evidence_dtype.py`` measures what it changes in the kept sets).
        None: no preference.
    window : int
        Per attention layer: its input hidden states (after the input norm) of the last ``window`` context tokens.
    """

    recurrent_signals: bool = False
    window: int = 0
    signal_dtype: torch.dtype | None = None

    def __post_init__(self):
        # a press's request is made once and read by every prefill: a wrong one is named where it is made
        if not isinstance(self.recurrent_signals, bool):
            raise ArgumentTypeError(f"recurrent_signals must be True or False, got {self.recurrent_signals!r}")
        object.__setattr__(self, "window", whole(self.window, "window (context tokens whose hidden states are "
                                                               "recorded; 0: none)", 0, text=False))
        if self.signal_dtype is not None and not (isinstance(self.signal_dtype, torch.dtype)
                                                  and self.signal_dtype.is_floating_point):
            raise ArgumentTypeError(f"signal_dtype must be a floating torch dtype (torch.float32, torch.bfloat16, …) "
                                    f"or None, got {self.signal_dtype!r}")

    def __or__(self, other: "EvidenceRequest") -> "EvidenceRequest":
        return EvidenceRequest(
            self.recurrent_signals or other.recurrent_signals,
            max(self.window, other.window),
            # the wider of the two preferences: a press that needs float32 signals gets them
            max((d for d in (self.signal_dtype, other.signal_dtype) if d is not None),
                key=lambda d: torch.finfo(d).bits, default=None),
        )


@dataclass
class Evidence:
    """What the prefill recorded, keyed by layer index.

    Attributes
    ----------
    recurrent_signals : dict[int, torch.Tensor]
        ``[n, Hv, 3]`` in the requested ``signal_dtype``, last axis (β, g, ‖v‖) or, for a Mamba2 layer,
        ``[n, H, 3]`` with (Δ·‖B‖, A·Δ, ‖x‖).
    window_hidden : dict[int, torch.Tensor]
        ``[w, D]`` in model dtype.
    """

    recurrent_signals: dict[int, torch.Tensor] = field(default_factory=dict)
    window_hidden: dict[int, torch.Tensor] = field(default_factory=dict)


class EvidenceRecorder:
    """Forward observer that fills an :class:`Evidence` during prefill (one or several chunks)."""

    def __init__(self, request: EvidenceRequest):
        self.request = request
        self._signals: dict[int, list[torch.Tensor]] = {}
        self._hidden: dict[int, list[torch.Tensor]] = {}

    def on_recurrent(self, layer_idx: int, signals: torch.Tensor) -> None:
        self._signals.setdefault(layer_idx, []).append(signals.to(self.request.signal_dtype or torch.float32))

    def on_attention(self, layer_idx, hidden, query, gate, keys, values, output) -> None:
        if self.request.window:
            chunks = self._hidden.setdefault(layer_idx, [])
            chunks.append(hidden[0, -self.request.window :].detach())
            # only the last `window` rows are ever needed, so drop older chunks as we go
            joined = torch.cat(chunks)[-self.request.window :]
            chunks[:] = [joined]

    @property
    def wants_recurrent_signals(self) -> bool:
        return self.request.recurrent_signals

    def result(self) -> Evidence:
        return Evidence(
            recurrent_signals={i: torch.cat(c) for i, c in self._signals.items()},
            window_hidden={i: c[0] for i, c in self._hidden.items()},
        )

"""The layer loop: one chunk of tokens through a hybrid model, from and into a :class:`SequenceState`.

The runtime drives the decoder layers itself instead of calling ``model.forward``: the GDN and Mamba2 layers continue
from their cached states (:mod:`runtime.gdn`, :mod:`runtime.mamba2`) and the attention layers attend over a
compacted, possibly ragged cache (:mod:`runtime.kv`). Weights, norms, MLPs and RoPE are the model's own modules,
reached through the adapter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from .adapters import ModelAdapter, apply_rope
from .explicit_attention import attend_with_key_max
from .gdn import RecurrentState, gdn_forward
from .kv import LayerKV, attend
from .mamba2 import mamba2_forward


class ForwardObserver(Protocol):
    """Receives what a forward computes; used for evidence capture and by scorers that run extra passes.

    An observer may also declare ``last_layer`` (an int): it reads nothing computed after that layer's mixer, so
    :func:`forward_chunk` stops there (KVzip's reconstruction pass: on a hybrid whose last layers are recurrent,
    those layers, every MLP after the last attention and the output head never run).

    It may declare ``restricted_keys``, ``(protected, start, end)``: each attention layer then attends through
    :func:`runtime.explicit_attention.attend_with_key_max`, and ``on_attention`` gets ``restricted_max``
    ``[H, |R|]``, each key of ``R`` (stored entries ``[0, protected)`` and ``[start, end)``, then the chunk's own)
    its largest probability under a softmax over ``R`` alone (KVzip's score), computed from the pass's own logits
    instead of a second QK product. It needs a dense stored cache, as a prefilled context has.
    """

    wants_recurrent_signals: bool

    def on_recurrent(self, layer_idx: int, signals: torch.Tensor) -> None:
        """A recurrent layer's signals, when the observer ``wants_recurrent_signals``: ``[n, Hv, 3]`` (β, g, ‖v‖) of
        a GDN layer, or ``[n, H, 3]`` (Δ·‖B‖, A·Δ, ‖x‖) of a Mamba2 layer."""

    def on_attention(
        self,
        layer_idx: int,
        hidden: torch.Tensor,
        query: torch.Tensor,
        gate: torch.Tensor | None,
        keys: torch.Tensor,
        values: torch.Tensor,
        output: torch.Tensor,
    ) -> None: ...


@dataclass
class SequenceState:
    """Everything a sequence carries between chunks (batch of one).

    Attributes
    ----------
    base : dict[int, LayerKV]
        Stored context entries per attention layer (compacted in a child).
    tail : dict[int, tuple[torch.Tensor, torch.Tensor]]
        Keys and values ``[H_kv, t, d]`` appended after ``base`` (question and generated tokens).
    recurrent : dict[int, RecurrentState]
        Recurrent states of the GDN and Mamba2 layers.
    next_position : int
        RoPE position of the next token: the original context length plus the tail, whatever was evicted.
    """

    base: dict[int, LayerKV] = field(default_factory=dict)
    tail: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    recurrent: dict[int, RecurrentState] = field(default_factory=dict)
    next_position: int = 0

    def branch(self) -> "SequenceState":
        """A state that shares the stored entries and continues from copies of the recurrent states."""
        return SequenceState(dict(self.base), {}, {i: s.clone() for i, s in self.recurrent.items()}, self.next_position)


def _attention(adapter: ModelAdapter, state: SequenceState, layer_idx: int, x: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor, observer: ForwardObserver | None) -> torch.Tensor:
    """One attention mixer: the chunk's keys and values (from ``x`` ``[1, L, D]``) join the layer's appended entries
    in ``state``, its queries attend over the stored and appended entries; returns the output ``[1, L, D]``."""
    x = adapter.attention_input(layer_idx, x)
    query, gate = adapter.project_query(layer_idx, x)
    keys, values = adapter.project_kv(layer_idx, x)
    query, keys = apply_rope(query, cos, sin), apply_rope(keys, cos, sin)
    if layer_idx in state.tail:
        old_keys, old_values = state.tail[layer_idx]
        keys_all, values_all = torch.cat([old_keys, keys], 1), torch.cat([old_values, values], 1)
    else:
        keys_all, values_all = keys, values
    state.tail[layer_idx] = (keys_all, values_all)
    scale = adapter.attention_module(layer_idx).scaling
    base = state.base.get(layer_idx)
    restricted = getattr(observer, "restricted_keys", None)
    if restricted is None:
        attn = attend(query, base, keys_all, values_all, scale)
    else:
        if base is None or base.ragged or base.valid is not None:
            layout = "nothing" if base is None else "a ragged cache" if base.ragged else "a padded batch cache"
            raise ValueError(f"layer {layer_idx}: restricted_keys={restricted!r} needs a dense stored cache, the "
                             f"layer holds {layout}")
        attn, restricted_max = attend_with_key_max(query, base.keys, base.values, keys_all, values_all, scale,
                                                   restricted)
    out = adapter.output(layer_idx, attn, gate)
    if observer is not None and restricted is not None:
        observer.on_attention(layer_idx, x, query, gate, keys, values, out, restricted_max=restricted_max)
    elif observer is not None:
        observer.on_attention(layer_idx, x, query, gate, keys, values, out)
    return out


@torch.no_grad()
def forward_chunk(
    adapter: ModelAdapter,
    state: SequenceState,
    ids: torch.Tensor,
    observer: ForwardObserver | None = None,
    all_logits: bool = False,
) -> torch.Tensor | None:
    """Run ``ids`` ``[L]`` after ``state`` (updated in place) and return logits.

    Returns
    -------
    torch.Tensor or None
        ``[L, V]`` if ``all_logits`` else ``[1, V]`` for the last token; None if ``observer`` declares a
        ``last_layer``: the pass ends after that layer's mixer, and ``state`` is then fit only to be discarded (the
        later layers' states and the next position are not advanced).
    """
    length = ids.shape[0]
    # an int, or under vmap one child's 0-d tensor (children of different contexts: runtime.batch)
    positions = state.next_position + torch.arange(length, device=ids.device)
    hidden = adapter.embed(ids)
    cos, sin = adapter.rope(hidden, positions)
    record_signals = observer is not None and observer.wants_recurrent_signals
    last_layer = getattr(observer, "last_layer", None)
    for layer_idx, kind in enumerate(adapter.layer_kinds):
        x = adapter.input_norm(layer_idx, hidden)
        if kind == "gdn":
            out, state.recurrent[layer_idx], signals = gdn_forward(
                adapter, layer_idx, x, state.recurrent.get(layer_idx), record_signals
            )
            if signals is not None:
                observer.on_recurrent(layer_idx, signals)
        elif kind == "attention":
            out = _attention(adapter, state, layer_idx, x, cos, sin, observer)
        else:  # "mamba2", or "mamba2+attention": Falcon-H1's parallel mixers read the same input and their outputs add
            out, state.recurrent[layer_idx], signals = mamba2_forward(
                adapter, layer_idx, x, state.recurrent.get(layer_idx), record_signals
            )
            if signals is not None:
                observer.on_recurrent(layer_idx, signals)
            if kind == "mamba2+attention":
                out = out + _attention(adapter, state, layer_idx, x, cos, sin, observer)
        if layer_idx == last_layer:
            return None
        hidden = hidden + out
        hidden = hidden + adapter.mlp(layer_idx, hidden)
    state.next_position = state.next_position + length  # not in place: under vmap it may be the caller's tensor
    return adapter.logits(hidden if all_logits else hidden[:, -1:])

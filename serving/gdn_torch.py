"""A pure-torch GDN forward for the layers vLLM's CPU kernels reject (head dims other than 64 and 128, dtypes other
than bfloat16: the shipped default model has head dim 32 and float32 weights).

Each sequence of a step runs the runtime's own kernel (:func:`runtime.gdn.gdn_core`: convolution, gates, delta
rule) from the conv and recurrent states in its vLLM slot and writes the new states back, so the engine computes
what the runtime computes. The input projections, the gated norm and the output projection are vLLM's layer's own.
:func:`serving.vllm_internals.gdn.torch_gdn_where_kernels_refuse` routes the layers here while the engine is built.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from runtime.gdn import RecurrentState, gdn_core

from .vllm_internals import gdn as vi
from .vllm_internals.runner import layer_index

signal_observers: list[Callable[[int, torch.Tensor, int], None]] = []
"""Called with ``(layer index, [tokens, Hv, 3] (β, g, ‖v‖), the sequence's index in the step's batch)`` for the
prefill tokens of every sequence this path runs (:class:`serving.signals.GDNSignalRecorder` listens here as it
listens to vLLM's gating op)."""


def forward(layer, hidden_states: torch.Tensor) -> torch.Tensor:
    """``[T, D]`` output of the GDN ``layer`` (vLLM's ``QwenGatedDeltaNetAttention``) for this step's tokens."""
    mixed_qkv, z, b, a = vi.gdn_projections(layer, hidden_states)
    core = torch.zeros(vi.gdn_core_shape(layer, hidden_states.shape[0]), dtype=hidden_states.dtype,
                       device=hidden_states.device)
    sequences = vi.gdn_sequences(layer)
    if sequences:
        conv_states, recurrent_states = vi.gdn_state_views(layer)
        weight = vi.gdn_conv_weight(layer)
        width = conv_states.shape[-1]
        for sequence, (start, end, slot, resumes, is_prefill) in enumerate(sequences):
            state = RecurrentState(conv_states[slot], recurrent_states[slot].float()) if resumes else None
            record = is_prefill and bool(signal_observers)
            out, state, signals = gdn_core(layer, mixed_qkv[start:end].transpose(0, 1), b[start:end], a[start:end],
                                           state, conv_weight=weight, record_signals=record)
            conv_states[slot] = state.conv[:, -width:].to(conv_states.dtype)
            recurrent_states[slot] = state.recurrent.to(recurrent_states.dtype)
            core[start:end] = out.to(core.dtype)
            if record:
                for observe in signal_observers:
                    observe(layer_index(layer), signals, sequence)
    return vi.gdn_output(layer, core, z)

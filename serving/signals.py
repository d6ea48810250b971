"""Evidence from vLLM's own forward: (β, g, ‖v‖) of every GDN layer, exactly as its CPU op computes them
(GateSight), the queries of the context's last tokens at every attention layer (SnapKV), and the queries and keys
of a pass run after a held context (KVzip).

vLLM's CPU GDN op (``model_executor/layers/mamba/ops/cpu/gdn_attention.py``) splits the convolved ``mixed_qkv``
with the layer's ``rearrange_mixed_qkv`` and then gates with ``fused_gdn_gating_cpu(A_log, a, b, dt_bias)`` on the
prefill tokens. The recorder wraps the first per layer instance (it knows the layer and sees v) and the second in
the op's module (it returns g and β), so nothing of vLLM's is edited and the numbers are those the kernel used.
Layers the CPU kernels reject run the plugin's pure-torch path (:mod:`serving.gdn_torch`), which reports its own.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from . import gdn_torch
from . import vllm_internals as vi

_LAYER = re.compile(r"layers\.(\d+)\.")
_recording: list["GDNSignalRecorder"] = []  # the recorder that is on, if any (the gating wrapper is process-wide)


class GDNSignalRecorder:
    """Records ``[tokens, Hv, 3]`` (β, g, ‖v‖) per GDN layer for the prefill tokens that pass while it is on.

    vLLM batches the prefill tokens of all scheduled requests into one op call; the engine driver prefills one
    context at a time while recording (:class:`serving.engine.CompactingLLM`), so every recorded token is the
    context's.
    """

    def __init__(self, model: nn.Module):
        layers = {int(_LAYER.search(m.prefix).group(1)): m for m in vi.gdn_layers(model)}
        self._chunks: dict[int, list[torch.Tensor]] = {}
        self._pending: tuple[int, torch.Tensor] | None = None
        for index, module in layers.items():
            module.rearrange_mixed_qkv = self._wrap_rearrange(index, module.rearrange_mixed_qkv)
        vi.wrap_gdn_gating(_record_gating)
        gdn_torch.signal_observers.append(self._observe_torch_path)

    def _wrap_rearrange(self, index: int, rearrange):
        def rearrange_and_keep_v(mixed_qkv):
            query, key, value = rearrange(mixed_qkv)
            if self in _recording and value is not None:
                self._pending = (index, value[0].float().norm(dim=-1))  # [tokens, Hv]
            return query, key, value

        return rearrange_and_keep_v

    def _gated(self, g: torch.Tensor, beta: torch.Tensor) -> None:
        if self._pending is not None:
            index, vnorm = self._pending
            self._pending = None
            signals = torch.stack([beta.reshape(vnorm.shape).float(), g.reshape(vnorm.shape).float(), vnorm], -1)
            self._chunks.setdefault(index, []).append(signals)

    def _observe_torch_path(self, prefix: str, signals: torch.Tensor) -> None:
        if self in _recording:
            self._chunks.setdefault(int(_LAYER.search(prefix).group(1)), []).append(signals.float())

    def start(self) -> None:
        self._chunks, self._pending = {}, None
        _recording[:] = [self]

    def stop(self) -> dict[int, torch.Tensor]:
        """Stop recording; the signals ``[n, Hv, 3]`` per GDN layer index."""
        _recording.clear()
        return {index: torch.cat(chunks) for index, chunks in self._chunks.items()}


def _record_gating(gating):
    def gating_and_record(*args, **kwargs):
        g, beta = gating(*args, **kwargs)
        for recorder in _recording:
            recorder._gated(g, beta)
        return g, beta

    return gating_and_record


class WindowQueryRecorder:
    """Records the queries of the last ``window`` prefill tokens per attention layer, as vLLM's attention layers
    receive them (post q-norm, post-RoPE at the tokens' positions; gated ``q_proj`` already split off).

    Like :class:`GDNSignalRecorder` it sees every prefill token of a step, so the engine driver prefills one context
    at a time while recording; :meth:`stop` also returns how many tokens each layer saw.
    """

    def __init__(self, layers: dict[int, nn.Module], window: int):
        self.window, self._on, self._tails, self._seen = window, False, {}, {}
        for index, layer in layers.items():
            vi.observe_attention_inputs(layer, self._observer(index))

    def _observer(self, index: int):
        def observe(query: torch.Tensor, key: torch.Tensor) -> None:
            if self._on:
                # only the last `window` rows are ever needed: keep a rolling tail over the prefill's chunks
                tail = torch.cat([self._tails.get(index, query[:0]), query.detach().reshape(query.shape[0], -1)])
                self._tails[index] = tail[-self.window:].clone()
                self._seen[index] = self._seen.get(index, 0) + query.shape[0]

        return observe

    def start(self) -> None:
        self._on, self._tails, self._seen = True, {}, {}

    def stop(self) -> tuple[dict[int, torch.Tensor], dict[int, int]]:
        """Stop recording; the queries ``[min(window, n), H * d]`` per attention layer, and the tokens each saw."""
        self._on = False
        return self._tails, self._seen


class PassRecorder:
    """Records every query and key ``[tokens, H * d]``, ``[tokens, H_kv * d]`` per attention layer while it is on:
    one pass after a held context (KVzip's reconstruction), run by the engine driver alone in flight."""

    def __init__(self, layers: dict[int, nn.Module]):
        self._on, self._chunks = False, {}
        for index, layer in layers.items():
            vi.observe_attention_inputs(layer, self._observer(index))

    def _observer(self, index: int):
        def observe(query: torch.Tensor, key: torch.Tensor) -> None:
            if self._on:
                self._chunks.setdefault(index, []).append((query.detach().clone(), key.detach().clone()))

        return observe

    def start(self) -> None:
        self._on, self._chunks = True, {}

    def stop(self) -> tuple[dict[int, tuple[torch.Tensor, torch.Tensor]], dict[int, int]]:
        """Stop recording; ``(queries, keys)`` per attention layer, and the tokens each layer saw."""
        self._on = False
        attention = {index: tuple(torch.cat(parts) for parts in zip(*chunks)) for index, chunks in self._chunks.items()}
        return attention, {index: q.shape[0] for index, (q, _) in attention.items()}

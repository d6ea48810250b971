"""Evidence from vLLM's own forward: (β, g, ‖v‖) of every GDN layer, exactly as its CPU op computes them
(GateSight), the queries of the context's last tokens at every attention layer (SnapKV), and the queries and keys
of a pass run after a held context (KVzip). Several contexts may prefill together: each step's tokens are split by
request in the batch's order.

vLLM's CPU GDN op (``model_executor/layers/mamba/ops/cpu/gdn_attention.py``) splits the convolved ``mixed_qkv``
with the layer's ``rearrange_mixed_qkv`` and then gates with ``fused_gdn_gating_cpu(A_log, a, b, dt_bias)`` on the
prefill tokens. The recorder wraps the first per layer instance (it knows the layer and sees v) and the second in
the op's module (it returns g and β), so nothing of vLLM's is edited and the numbers are those the kernel used.
Layers the CPU kernels reject run the plugin's pure-torch path (:mod:`serving.gdn_torch`), which reports its own.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from . import gdn_torch
from .vllm_internals import gdn as vi_gdn
from .vllm_internals import runner as vi

_recording: list["GDNSignalRecorder"] = []  # the recorder that is on, if any (the gating wrapper is process-wide)


class GDNSignalRecorder:
    """Records ``[tokens, Hv, 3]`` (β, g, ‖v‖) per request and GDN layer for the prefill tokens that pass while it
    is on.

    vLLM batches the prefill tokens of all scheduled requests into one op call, in the batch's order; ``layout``
    (:func:`serving.vllm_internals.runner.step_layout`) gives each step's requests and token counts, so every request
    gets its own tokens. The engine driver records only while contexts are prefilled, none decoding.
    """

    def __init__(self, model: nn.Module, layout):
        self._layout = layout
        self._chunks: dict[str, dict[int, list[torch.Tensor]]] = {}
        self._pending: tuple[int, torch.Tensor] | None = None
        for index, module in vi_gdn.gdn_layers(model).items():
            vi_gdn.wrap_gdn_rearrange(module, functools.partial(self._wrap_rearrange, index))
        vi_gdn.wrap_gdn_gating(_record_gating)
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
            layout = self._layout()
            if sum(count for _, count in layout) != signals.shape[0]:
                raise RuntimeError(f"the GDN op gated {signals.shape[0]} prefill tokens in a step of "
                                   f"{sum(count for _, count in layout)}: record while contexts prefill, none "
                                   "decoding")
            for (request_id, _), part in zip(layout, signals.split([count for _, count in layout])):
                self._chunks.setdefault(request_id, {}).setdefault(index, []).append(part)

    def _observe_torch_path(self, index: int, signals: torch.Tensor, sequence: int) -> None:
        if self in _recording:
            request_id = self._layout()[sequence][0]
            self._chunks.setdefault(request_id, {}).setdefault(index, []).append(signals.float())

    def start(self) -> None:
        self._chunks, self._pending = {}, None
        _recording[:] = [self]

    def take(self, request_id: str) -> dict[int, torch.Tensor]:
        """The signals ``[n, Hv, 3]`` per GDN layer index of one request, forgotten here."""
        return {index: torch.cat(chunks) for index, chunks in self._chunks.pop(request_id, {}).items()}

    def stop(self) -> None:
        _recording.clear()
        self._chunks = {}


def _record_gating(gating):
    def gating_and_record(*args, **kwargs):
        g, beta = gating(*args, **kwargs)
        for recorder in _recording:
            recorder._gated(g, beta)
        return g, beta

    return gating_and_record


class WindowQueryRecorder:
    """Records, per request, the queries of its last ``window`` prefill tokens at every attention layer, as vLLM's
    attention layers receive them (post q-norm, post-RoPE at the tokens' positions; gated ``q_proj`` already split
    off). Each step's queries are split by request with ``layout``, as :class:`GDNSignalRecorder` splits its
    signals."""

    def __init__(self, layers: dict[int, nn.Module], window: int, layout):
        self.window, self._layout, self._on, self._tails, self._seen = window, layout, False, {}, {}
        for index, layer in layers.items():
            vi.observe_attention_inputs(layer, self._observer(index))

    def _observer(self, index: int):
        def observe(query: torch.Tensor, key: torch.Tensor) -> None:
            if not self._on:
                return
            layout = self._layout()
            counts = [count for _, count in layout]
            # only the last `window` rows are ever needed: keep a rolling tail per request over its chunks
            for (request_id, count), part in zip(layout, query.detach()[: sum(counts)].split(counts)):
                tails, seen = self._tails.setdefault(request_id, {}), self._seen.setdefault(request_id, {})
                tail = torch.cat([tails.get(index, part[:0]).reshape(-1, part.shape[-1]), part])
                tails[index] = tail[-self.window:].clone()
                seen[index] = seen.get(index, 0) + count

        return observe

    def start(self) -> None:
        self._on, self._tails, self._seen = True, {}, {}

    def take(self, request_id: str) -> tuple[dict[int, torch.Tensor], dict[int, int]]:
        """One request's queries ``[min(window, n), H * d]`` per attention layer, and the tokens each layer saw."""
        return self._tails.pop(request_id, {}), self._seen.pop(request_id, {})

    def stop(self) -> None:
        self._on, self._tails, self._seen = False, {}, {}


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

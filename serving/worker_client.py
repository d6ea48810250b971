"""The engine driver's side of the worker: one method per call of :class:`serving.worker.CompactionWorker`, with
typed results.

:class:`WorkerClient` is the only caller of ``collective_rpc`` in :mod:`serving`: every method calls the worker
method of the same name (prefixed ``hybridpress_``) on the one in-process worker and returns its result, a frozen
dataclass where the worker answers more than one value. Nothing here imports vLLM, so the result types are
importable in any environment.

The calls, in the order a context meets them (the worker's per-context state, :class:`serving.worker_state.HeldState`,
follows the same order):

1. :meth:`setup` once, when the engine is built (the worker learns its pages; the page :class:`Geometry` comes
   back); :meth:`prepare_press` and :meth:`check_allocator` refuse, before any prefill, what cannot run.
2. :meth:`start_recording`, the prefill steps, :meth:`prefilled` for each context as its prefill ends (its state is
   created), :meth:`stop_recording`.
3. To compact it: :meth:`passes` (the passes its press runs after it, if any), each run as a request between
   :meth:`record_pass` and :meth:`pass_recorded`; then :meth:`compact` (a :class:`Compaction` comes back).
4. Around every request attached to a held context (questions, passes, copies): :meth:`attach`, :meth:`detach`.
5. :meth:`read` any time it is held; :meth:`forget` when it is released.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass(frozen=True)
class Geometry:
    """The served model's pages, as the worker learned them (:meth:`WorkerClient.setup`).

    Attributes
    ----------
    block_size : int
        Tokens per attention block (a block holds one layer's page).
    attention_groups : dict[int, int]
        The KV-cache group of each attention layer.
    layer_entry_bytes : int
        Bytes of one entry of one attention layer (keys and values, all KV heads).
    state_bytes : int
        Bytes of one sequence's recurrent states (conv and GDN, all layers).
    """

    block_size: int
    attention_groups: dict[int, int]
    layer_entry_bytes: int
    state_bytes: int


@dataclass(frozen=True)
class Compaction:
    """What the worker did to a held context (:meth:`WorkerClient.compact`).

    Attributes
    ----------
    computed : int
        The context's computed count from now on: the largest kept count of any layer.
    kept : dict[int, int]
        Per attention layer, the entries each KV head keeps (the protected prefix included).
    plan : dict[int, list[list[int]]]
        Per attention layer, each head's kept body positions.
    score_seconds : float
        Scoring and planning (the passes after the context not included).
    """

    computed: int
    kept: dict[int, int]
    plan: dict[int, list[list[int]]]
    score_seconds: float


class LayerPages(NamedTuple):
    """One attention layer's entries in a held context's pages, ``[H_kv, kept, d]`` each (CPU)."""

    keys: torch.Tensor
    values: torch.Tensor


BlockIds = tuple[list[int], ...]
"""Block ids per KV-cache group."""


class WorkerClient:
    """Typed calls to the compaction worker of an in-process ``vllm.LLM`` built with ``worker_extension_cls =
    serving.worker.CompactionWorker``.

    Parameters
    ----------
    llm : vllm.LLM
    """

    def __init__(self, llm):
        self._llm = llm

    def _call(self, name: str, *args):
        return self._llm.collective_rpc(f"hybridpress_{name}", args=args)[0]

    def setup(self) -> Geometry:
        """Build the worker's state (adapter, page layouts, per-group offsets); once, before any other call."""
        return self._call("setup")

    def prepare_press(self, press: str, options: dict | None) -> None:
        """Build ``press`` with ``options`` for this model on the worker, refusing one that cannot run here."""
        self._call("prepare_press", press, options)

    def check_allocator(self, allocator: str, options: dict | None) -> None:
        self._call("check_allocator", allocator, options)

    def start_recording(self, presses: list[str], options: dict | None) -> None:
        """Record, per request, the evidence every press of ``presses`` (built with ``options``) reads, from the
        next prefill step on."""
        self._call("start_recording", presses, options)

    def prefilled(self, handle: str, n: int) -> None:
        """The request ``handle`` prefilled its ``n``-token context: its evidence is kept for the held context
        ``handle``."""
        self._call("prefilled", handle, n)

    def stop_recording(self) -> None:
        self._call("stop_recording")

    def passes(self, handle: str, context_ids: list[int], blocks: BlockIds, protected: int, press: str,
               press_options: dict | None) -> list[list[int]]:
        """The ids of every pass ``press`` runs after the held context ``handle`` (its pages in ``blocks``)."""
        return self._call("passes", handle, context_ids, blocks, protected, press, press_options)

    def record_pass(self, handle: str, ids: list[int]) -> None:
        """Record what the attention layers see of the next request, the pass ``ids`` after ``handle``."""
        self._call("record_pass", handle, ids)

    def pass_recorded(self, handle: str) -> None:
        self._call("pass_recorded", handle)

    def compact(self, handle: str, context_ids: list[int], blocks: BlockIds, keep_fraction: float, protected: int,
                allocator: str, allocator_options: dict | None, press: str, press_options: dict | None
                ) -> Compaction:
        """Score the held context ``blocks`` (the evidence and passes of ``handle``) with ``press``, plan with
        ``allocator`` and gather each attention layer's kept entries to the front of its blocks."""
        return self._call("compact", handle, context_ids, blocks, keep_fraction, protected, allocator,
                          allocator_options, press, press_options)

    def attach(self, request_id: str, source: BlockIds, target: BlockIds, computed: int,
               kept: dict[int, int]) -> None:
        """Copy the held context in ``source`` into the request's ``target`` blocks and set its layers' offsets."""
        self._call("attach", request_id, source, target, computed, kept)

    def detach(self, request_id: str) -> None:
        self._call("detach", request_id)

    def read(self, blocks: dict[int, list[int]], kept: dict[int, int]) -> dict[int, LayerPages]:
        """Per attention layer, the first ``kept[layer]`` entries of its blocks ``blocks[layer]``."""
        return self._call("read", blocks, kept)

    def forget(self, handle: str) -> None:
        """Drop the worker's state of the released context ``handle``."""
        self._call("forget", handle)

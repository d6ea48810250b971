"""The worker side of compaction: score a held context with the project's presses, plan with its allocators,
gather the kept entries to the front of each attention layer's blocks.

:class:`CompactionWorker` is mixed into vLLM's worker through ``worker_extension_cls``; the engine driver calls its
methods through :class:`serving.worker_client.WorkerClient`, one client method per worker method. Everything the
extension keeps is one :class:`~serving.worker_state.WorkerState` (built by ``hybridpress_setup``), with one
:class:`~serving.worker_state.HeldState` per held context. The presses see a
:class:`~serving.served_context.ServedContext`: the attributes of a runtime ``Parent`` that scoring reads, read from
vLLM's pages.

Positions. vLLM gives the next token of a request the position ``num_computed_tokens``, which becomes K, the largest
kept count of any attention layer, after compaction, while the runtime continues at n. RoPE scores depend only on
the distance between query and key, so every kept key is rotated by ``-(n - K)``
(:meth:`~serving.worker_state.WorkerState.gather`): a query at ``K + j`` then sees a key of original position p at
distance ``n + j - p``, exactly as in the runtime's child. Layer ℓ holds its k_ℓ entries at token offsets
0 ... k_ℓ - 1 of its own KV-cache group; a question's token j goes to offset k_ℓ + j and sees k_ℓ + j + 1 keys
there: the group's view of the request is shifted back by K - k_ℓ
(:func:`serving.vllm_internals.runner.install_group_offsets`).
"""

from __future__ import annotations

import time

import torch

import allocators
import presses
from presses.calibration import Calibration
from presses.preparation import evidence_for, press_call
from runtime import Evidence
from runtime.user_code import run_users

from .rules import check_allocator
from .served_context import Passes
from .signals import GDNSignalRecorder, WindowQueryRecorder
from .vllm_internals import runner as vi
from .worker_client import BlockIds, Compaction, Geometry, LayerPages
from .worker_state import HeldState, WorkerState


class CompactionWorker:
    """Methods for ``LLM.collective_rpc`` (prefixed so that they never collide with the worker's own), called through
    :class:`serving.worker_client.WorkerClient` in its order; their state is :attr:`hybridpress`."""

    hybridpress: WorkerState | None = None
    """Built by :meth:`hybridpress_setup`, before any other call."""

    def _hybridpress(self) -> WorkerState:
        if self.hybridpress is None:
            raise RuntimeError("the compaction worker is not set up: CompactingLLM calls hybridpress_setup first")
        return self.hybridpress

    def hybridpress_setup(self) -> Geometry:
        """Build the worker's state (once): the adapter, the page layouts, the per-group offsets. The evidence
        recorders are built when a prefill first records what they record."""
        if self.hybridpress is None:
            self.hybridpress = WorkerState.build(vi.model_runner(self))
        return self.hybridpress.geometry

    def hybridpress_prepare_press(self, press: str, options: dict | None = None) -> None:
        """Build ``press`` (with ``options``) for this model now: a press that cannot run here is refused before any
        prefill."""
        self._hybridpress().press(press, options)

    def hybridpress_start_recording(self, press_names: list[str], options: dict | None = None) -> None:
        """Start recording the evidence of the next prefills, per request: what every press of ``press_names``
        (built with ``options``) reads."""
        state = self._hybridpress()
        request = evidence_for([state.press(name, options) for name in press_names], state.adapter)
        if request.recurrent_signals:
            if state.gdn_recorder is None:
                state.gdn_recorder = GDNSignalRecorder(vi.model_module(state.runner), state.step_layout)
            state.gdn_recorder.start()
        if request.window:
            if state.window_recorder is None:
                state.window_recorder = WindowQueryRecorder(state.layers, request.window, state.step_layout)
            state.window_recorder.window = request.window
            state.window_recorder.start()
        state.recording = request

    def hybridpress_prefilled(self, handle: str, n: int) -> None:
        """The evidence of the request ``handle``, whose ``n``-token context was just prefilled (checked to be all
        its tokens'), kept for the held context ``handle``: its :class:`HeldState` is created."""
        state = self._hybridpress()
        request = state.recording
        signals = state.gdn_recorder.take(handle) if request.recurrent_signals else {}
        if request.recurrent_signals and (not signals or any(s.shape[0] != n for s in signals.values())):
            raise RuntimeError(f"recorded the GDN signals of {sorted({s.shape[0] for s in signals.values()})} "
                               f"tokens for a context of {n}")
        window = {}
        if request.window:
            window, seen = state.window_recorder.take(handle)
            if set(seen.values()) != {n}:
                raise RuntimeError(f"recorded the queries of {sorted(set(seen.values()))} prefill tokens for a "
                                   f"context of {n}")
        state.contexts[handle] = HeldState(request, Evidence(recurrent_signals=signals, window_hidden=window))

    def hybridpress_stop_recording(self) -> None:
        state = self._hybridpress()
        for recorder in (state.gdn_recorder, state.window_recorder):
            if recorder is not None:
                recorder.stop()
        state.recording = None

    def hybridpress_check_allocator(self, allocator: str, options: dict | None = None) -> None:
        """Refuse, before any prefill, an allocator that cannot run here: unknown, ill-built options, a per-layer
        value for another number of attention layers, or (``gate``) a model directory without its calibration."""
        adapter = self._hybridpress().adapter
        check_allocator(allocator)
        built = allocators.get(allocator, **(options or {}))
        # a user's allocator (an installed plugin) failing is one line naming it; a ValueError is its refusal
        run_users(built.check_layers, type(built), f"allocator {allocator}", "in check_layers",
                  len(adapter.attention_layers), passing=(ValueError,))
        model_dir = adapter.model_dir
        if built.needs_layer_weights and (model_dir is None or not Calibration.exists(model_dir)):
            Calibration.for_model(adapter)  # raises, naming the command that writes it

    def hybridpress_forget(self, handle: str) -> None:
        """Drop the state of a released context (none for a copy: it is compacted with its parent's)."""
        self._hybridpress().contexts.pop(handle, None)

    def hybridpress_passes(self, handle: str, context_ids: list[int], blocks: BlockIds, protected: int, press: str,
                           press_options: dict | None = None) -> list[list[int]]:
        """The ids of every pass ``press`` runs after the held context ``blocks`` (KVzip's reconstruction prompts;
        none for a press that reads only the prefill): a first round of its scoring, whose scores are dropped. The
        compaction of ``handle`` starts here: its recorded passes are emptied."""
        state = self._hybridpress()
        state.held(handle).passes = []
        chosen = state.press(press, press_options)
        if not chosen.runs_after_context:
            return []
        passes = Passes()
        press_call(chosen, "score", state.served_context(handle, context_ids, blocks, protected, chosen, passes))
        return passes.asked

    def hybridpress_record_pass(self, handle: str, ids: list[int]) -> None:
        """Record the attention inputs of the next request: the pass ``ids`` after ``handle``, alone in flight."""
        state = self._hybridpress()
        state.held(handle).recording_pass = ids
        state.pass_recorder.start()

    def hybridpress_pass_recorded(self, handle: str) -> None:
        """The pass after ``handle`` ended: what its attention layers saw joins the passes of the compaction."""
        state = self._hybridpress()
        held = state.held(handle)
        attention, seen = state.pass_recorder.stop()
        ids, held.recording_pass = held.recording_pass, None
        n = len(ids)
        if set(seen.values()) != {n}:
            raise RuntimeError(f"recorded {sorted(set(seen.values()))} tokens of a {n}-token pass: run passes one "
                               "at a time")
        g = state.adapter.geometry
        held.passes.append((ids, {
            layer: (query.view(n, -1, g.head_dim).transpose(0, 1), keys.view(n, -1, g.head_dim).transpose(0, 1))
            for layer, (query, keys) in attention.items()}))

    def hybridpress_compact(self, handle: str, context_ids: list[int], blocks: BlockIds, keep_fraction: float,
                            protected: int, allocator: str, allocator_options: dict | None, press: str,
                            press_options: dict | None = None) -> Compaction:
        """Score with ``press``, plan with ``allocator`` and compact the held context ``blocks`` (block ids per
        KV-cache group) of ``context_ids``, not yet compacted, with the evidence and passes recorded for the held
        context ``handle`` (itself, or the one it is a copy of): each attention layer's kept entries go to the
        front of its blocks."""
        state = self._hybridpress()
        n = len(context_ids)
        held, chosen = state.held(handle), state.press(press, press_options)
        recorded, held.passes = held.passes, []
        context = state.served_context(handle, context_ids, blocks, protected, chosen, Passes(recorded))
        t0 = time.perf_counter()
        check_allocator(allocator)
        plan = presses.Selection(context, chosen).plan(allocators.get(allocator, **(allocator_options or {})),
                                                       keep_fraction)
        score_seconds = time.perf_counter() - t0
        kept = {}
        for layer, heads in plan.layers.items():
            counts = {len(h) for h in heads}
            if len(counts) != 1:
                raise ValueError(f"the plan keeps {sorted(counts)} entries in the heads of layer {layer}; the engine "
                                 "compacts the heads of a layer to one count")
            kept[layer] = protected + counts.pop()
        empty = [layer for layer, k in kept.items() if k == 0]
        if empty:
            raise ValueError(f"keep_fraction={keep_fraction} with protected=0 keeps no entry of attention layers "
                             f"{empty}: the engine holds at least one per layer; keep more, or protect a prefix")
        computed = max(kept.values())
        state.gather(context.kv, plan, blocks, n, computed, protected)
        return Compaction(computed=computed, kept=kept, score_seconds=score_seconds,
                          plan={layer: [h.tolist() for h in heads] for layer, heads in plan.layers.items()})

    def hybridpress_attach(self, request_id: str, source: BlockIds, target: BlockIds, computed: int,
                           kept: dict[int, int]) -> None:
        """Copy a held context into the question ``request_id``'s blocks: each attention layer's pages holding its
        ``kept[layer]`` entries, and the GDN states (conv and recurrent), so that decoding the question never
        changes the held context; and shift each attention layer's view of the question back by
        ``computed - kept[layer]``."""
        state = self._hybridpress()
        by_group = {state.groups[layer]: k for layer, k in kept.items()}
        for index, group in enumerate(state.cache_groups):
            # an attention group: the pages holding its kept entries; a recurrent group: its state slots
            count = -(-by_group[index] // state.geometry.block_size) if index in by_group else len(source[index])
            src, dst = (torch.as_tensor(ids[:count], dtype=torch.long) for ids in (source[index], target[index]))
            for name in group.names:
                for cache in vi.cache_tensors(state.modules[name]):
                    cache[dst.to(cache.device)] = cache[src.to(cache.device)]
        shifts = {group: computed - k for group, k in by_group.items() if k != computed}
        if shifts:
            state.offsets[request_id] = shifts

    def hybridpress_detach(self, request_id: str) -> None:
        """Forget a finished question's offsets."""
        self._hybridpress().offsets.pop(request_id, None)

    def hybridpress_read(self, blocks: dict[int, list[int]], kept: dict[int, int]) -> dict[int, LayerPages]:
        """Keys and values ``[H_kv, kept[layer], d]`` (CPU) of every attention layer at token offsets
        ``0 ... kept[layer] - 1`` of its blocks ``blocks[layer]``: what a held context's pages contain."""
        state = self._hybridpress()
        return {index: LayerPages(*(t.cpu() for t in state.layouts[index].read(vi.attention_cache(layer),
                                                                                blocks[index], kept[index])))
                for index, layer in state.layers.items()}

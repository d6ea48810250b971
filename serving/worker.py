"""The worker side of compaction: score a held context with the project's presses, plan with its allocators,
gather the kept entries to the front of each attention layer's blocks.

:class:`CompactionWorker` is mixed into vLLM's worker through ``worker_extension_cls``; the engine driver calls its
methods through :class:`serving.worker_client.WorkerClient`, one client method per worker method. Everything the
extension keeps is one :class:`WorkerState` (built by ``hybridpress_setup``), with one :class:`HeldState` per held
context. The presses see a :class:`ServedContext`: the attributes of a runtime ``Parent`` that scoring reads (the
adapter, the KV per layer as ``[H_kv, n, d]``, n, the protected prefix, the evidence recorded at its prefill, the
passes run after it), read from vLLM's pages. The adapter is the project's own, built on a meta-device twin of the
served model's configuration (no weights), with a real rotary embedding for re-rotating keys.

Positions. vLLM gives the next token of a request the position ``num_computed_tokens``, which becomes K, the largest
kept count of any attention layer, after compaction, while the runtime continues at n. RoPE scores depend only on
the distance between query and key, so every kept key is rotated by ``-(n - K)``: a query at ``K + j`` then sees a
key of original position p at distance ``n + j - p``, exactly as in the runtime's child. Layer ℓ holds its k_ℓ
entries at token offsets 0 ... k_ℓ - 1 of its own KV-cache group; a question's token j goes to offset k_ℓ + j and
sees k_ℓ + j + 1 keys there: the group's view of the request is shifted back by K - k_ℓ
(:func:`serving.vllm_internals.runner.install_group_offsets`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

import allocators
import presses
from presses.base import Press
from presses.calibration import Calibration
from presses.preparation import evidence_for, prepare
from runtime import Evidence, EvidenceRequest, KeepPlan, LayerKV
from runtime.adapters import ModelAdapter, adapter_for, apply_rope

from .pages import PageLayout
from .rules import check_allocator, check_press
from .signals import GDNSignalRecorder, PassRecorder, WindowQueryRecorder
from .vllm_internals import runner as vi
from .worker_client import BlockIds, Compaction, Geometry, LayerPages


class ServedContext:
    """What presses read of a ``runtime.Parent``, over one held context's paged cache in vLLM.

    Attributes
    ----------
    adapter : ModelAdapter-like
    kv : dict[int, LayerKV]
        Dense ``[H_kv, n, d]`` keys and values per attention layer (post-RoPE, original positions).
    n, protected : int
    evidence : Evidence
        GDN signals as the runtime records them; ``window_hidden`` holds, per attention layer, vLLM's own queries
        ``[w, H * d]`` of the last ``w`` context tokens (the adapter's ``queries`` returns them as they are: the
        twin has no weights to project layer inputs with).
    context_ids : torch.Tensor
        ``[n]`` the context's ids.
    passes : Passes
        The passes after the context (:meth:`observe`), run by the engine as requests attached to the held context.
    """

    def __init__(self, adapter, kv: dict[int, LayerKV], n: int, protected: int, evidence: Evidence,
                 context_ids: torch.Tensor, passes: "Passes", tokenizer_source):
        self.adapter, self.kv, self.n, self.protected, self.evidence = adapter, kv, n, protected, evidence
        self.context_ids, self.passes, self._tokenizer_source = context_ids, passes, tokenizer_source

    @property
    def tokenizer(self):
        return self._tokenizer_source()

    def observe(self, ids, observer, context_hash: str | None = None) -> None:
        """Run ``ids`` after the context, showing ``observer`` every attention layer's queries and keys of those
        tokens (KVzip's reconstruction pass). The engine ran the pass (:class:`Passes`)."""
        self.passes.run(ids, observer)


class Passes:
    """The passes a press runs after the context, in two rounds: asked for (``recorded=None``: :meth:`run` notes
    the ids), then replayed from what vLLM's attention layers saw while the engine ran each one as a request attached
    to the held context (:class:`serving.signals.PassRecorder`). The replay refuses ids the engine did not run."""

    def __init__(self, recorded: list[tuple[list[int], dict]] | None = None):
        self.asked: list[list[int]] = []
        self._recorded = None if recorded is None else list(recorded)

    def run(self, ids, observer) -> None:
        ids = [int(i) for i in ids]
        if self._recorded is None:
            self.asked.append(ids)
            return
        if not self._recorded or self._recorded[0][0] != ids:
            raise RuntimeError("the press asked for a pass after the context the engine did not run (its passes "
                               "must not depend on their own outputs)")
        _, attention = self._recorded.pop(0)
        if observer is not None:
            for layer, (query, keys) in sorted(attention.items()):
                observer.on_attention(layer, None, query, None, keys, None, None)


class _ServedAdapter:
    """The project's adapter of the meta twin, answering ``device`` and ``model_dir`` for the served model, and
    ``queries`` with the recorded ones."""

    def __init__(self, adapter: ModelAdapter, device: torch.device, model_dir: Path | None):
        self._adapter, self.device, self.model_dir = adapter, device, model_dir

    def __getattr__(self, name):
        return getattr(self._adapter, name)

    def queries(self, layer_idx: int, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``[H, L, d]``: the recorded post-RoPE queries ``hidden`` ``[1, L, H * d]`` (already rotated: ``cos``
        and ``sin`` are not applied again)."""
        return hidden[0].view(hidden.shape[1], -1, self._adapter.geometry.head_dim).transpose(0, 1)


def _twin_adapter(hf_config, device: torch.device, model_dir: Path | None) -> _ServedAdapter:
    from transformers import AutoModelForCausalLM

    config = hf_config.get_text_config()
    with torch.device("meta"):
        twin = AutoModelForCausalLM.from_config(config)
    # the rotary embedding is the one module computed for real: re-rotation needs its cos/sin
    twin.model.rotary_emb = type(twin.model.rotary_emb)(config=config).to(device)
    return _ServedAdapter(adapter_for(twin), device, model_dir)


@dataclass
class HeldState:
    """The worker's state of one held context, by the handle of the request that prefilled it (a copy of the context
    is compacted with its parent's state).

    Lifecycle: created by ``hybridpress_prefilled`` (the only place) as the context's prefill ends; each compaction
    of it (or of a copy) starts with ``hybridpress_passes``, which empties :attr:`passes`, records each pass between
    ``hybridpress_record_pass`` and ``hybridpress_pass_recorded``, and ends with ``hybridpress_compact``, which takes
    them; dropped by ``hybridpress_forget`` when the context is released.

    Attributes
    ----------
    recorded : EvidenceRequest
        What its prefill recorded.
    evidence : Evidence
        The GDN signals ``{layer: [n, Hv, 3]}`` and window queries recorded at its prefill.
    passes : list of (ids, {layer: (queries, keys)})
        The passes run after it for the compaction under way, each with the ``[H, L, d]`` queries and ``[H_kv, L,
        d]`` keys vLLM's attention layers saw.
    recording_pass : list of int or None
        The ids of the pass being recorded now.
    """

    recorded: EvidenceRequest
    evidence: Evidence
    passes: list[tuple[list[int], dict[int, tuple[torch.Tensor, torch.Tensor]]]] = field(default_factory=list)
    recording_pass: list[int] | None = None


@dataclass
class WorkerState:
    """Everything the compaction worker keeps, built once by ``hybridpress_setup`` (:meth:`build`, the only place).

    Attributes
    ----------
    runner
        vLLM's model runner.
    adapter : _ServedAdapter
        The project's adapter of a meta twin of the served model.
    cache_groups : list of vllm_internals.runner.CacheGroup
    modules : dict[str, nn.Module]
        Layer name -> vLLM's layer module holding its cache.
    groups : dict[int, int]
        Attention layer -> its KV-cache group.
    layers : dict[int, nn.Module]
        Attention layer -> vLLM's attention module.
    layouts : dict[int, PageLayout]
        Attention layer -> its backend's in-block layout.
    geometry : Geometry
    step_layout : callable
        The requests of the forward running now, with their token counts (:func:`vllm_internals.runner.step_layout`).
    pass_recorder : PassRecorder
    offsets : dict[str, dict[int, int]]
        Per request attached to a held context, the shift of each attention group that kept fewer entries than its
        computed count (read at every step by :func:`vllm_internals.runner.install_group_offsets`).
    presses : dict
        The presses built so far, by name and options.
    gdn_recorder, window_recorder
        Built when a prefill first records GDN signals, window queries.
    recording : EvidenceRequest or None
        What the prefills in flight record (``hybridpress_start_recording`` to ``hybridpress_stop_recording``).
    contexts : dict[str, HeldState]
        The held contexts, by the handle of the request that prefilled each.
    tokenizer
        The model directory's tokenizer, loaded when a press first asks for it.
    """

    runner: object
    adapter: _ServedAdapter
    cache_groups: list[vi.CacheGroup]
    modules: dict[str, nn.Module]
    groups: dict[int, int]
    layers: dict[int, nn.Module]
    layouts: dict[int, PageLayout]
    geometry: Geometry
    step_layout: Callable[[], list[tuple[str, int]]]
    pass_recorder: PassRecorder
    offsets: dict[str, dict[int, int]] = field(default_factory=dict)
    presses: dict[tuple[str, str], Press] = field(default_factory=dict)
    gdn_recorder: GDNSignalRecorder | None = None
    window_recorder: WindowQueryRecorder | None = None
    recording: EvidenceRequest | None = None
    contexts: dict[str, HeldState] = field(default_factory=dict)
    tokenizer: object = None

    @classmethod
    def build(cls, runner) -> "WorkerState":
        """Learn the runner's pages (one KV-cache group per attention layer), build the adapter and install the
        per-group offsets."""
        cache_groups = vi.cache_groups(runner)
        attention = [i for i, g in enumerate(cache_groups) if g.attention]
        if any(len(cache_groups[i].names) != 1 for i in attention):
            raise ValueError("expected one KV-cache group per attention layer: build the engine with "
                             "serving.CompactingLLM (serving.vllm_internals.driver.per_layer_kv_cache_groups)")
        modules = vi.layer_modules(runner)
        groups = {vi.layer_index(cache_groups[i].names[0]): i for i in attention}
        layers = {index: modules[cache_groups[i].names[0]] for index, i in groups.items()}
        config = vi.model_config(runner)
        device = vi.attention_cache(next(iter(layers.values()))).device
        model_dir = Path(config.model)
        adapter = _twin_adapter(config.hf_config, device, model_dir if model_dir.is_dir() else None)
        if tuple(sorted(layers)) != tuple(adapter.attention_layers):
            raise ValueError(f"vLLM's attention layers {sorted(layers)} are not the model's "
                             f"{adapter.attention_layers}")
        specs = {cache_groups[i].spec for i in attention}
        if len(specs) != 1:
            raise ValueError(f"the attention layers have different KV-cache specs {specs}")
        spec = cache_groups[attention[0]]
        layouts = {index: PageLayout.learn(layer, spec.block_size, spec.num_kv_heads, spec.head_size)
                   for index, layer in layers.items()}
        geometry = Geometry(
            block_size=spec.block_size, attention_groups=dict(groups),
            layer_entry_bytes=2 * spec.num_kv_heads * spec.head_size * spec.dtype.itemsize,
            state_bytes=sum(cache[0].nbytes for group in cache_groups if not group.attention
                            for name in group.names for cache in vi.cache_tensors(modules[name])))
        state = cls(runner, adapter, cache_groups, modules, groups, layers, layouts, geometry, vi.step_layout(runner),
                    PassRecorder(layers))
        vi.install_group_offsets(runner, state.offsets)
        return state

    def press(self, name: str, options: dict | None) -> Press:
        """``name`` built with ``options``, bound and checked for this model (as every caller does); built once."""
        key = (name, repr(sorted((options or {}).items())))
        if key not in self.presses:
            check_press(name)
            self.presses[key] = prepare(name, self.adapter, **(options or {}))
        return self.presses[key]

    def held(self, handle: str) -> HeldState:
        if handle not in self.contexts:
            raise ValueError(f"the worker holds no context {handle!r} (its prefill recorded nothing here, or it was "
                             "released)")
        return self.contexts[handle]

    def served_context(self, handle: str, context_ids: list[int], blocks: BlockIds, protected: int, press: Press,
                       passes: Passes) -> ServedContext:
        """The held context ``blocks`` as ``press`` reads it: its pages, the evidence of its prefill (recorded for
        ``handle``), its passes. A press reading evidence that prefill did not record is refused."""
        n = len(context_ids)
        held = self.held(handle)
        wanted = press.evidence(self.adapter)
        if (wanted.recurrent_signals and not held.recorded.recurrent_signals) or min(wanted.window, n) > min(
                held.recorded.window, n):
            raise ValueError(f"press {press.name!r} reads evidence the context was not held with ({wanted}; "
                             f"recorded {held.recorded}): hold it with this press among its presses")
        kv = {}
        for index, layer in self.layers.items():
            keys, values = self.layouts[index].read(vi.attention_cache(layer), blocks[self.groups[index]], n)
            positions = torch.arange(n, device=keys.device).expand(keys.shape[0], -1)
            kv[index] = LayerKV(keys, values, positions)
        return ServedContext(self.adapter, kv, n, protected, held.evidence, torch.tensor(context_ids), passes,
                             self.load_tokenizer)

    def load_tokenizer(self):
        """The model directory's tokenizer (KVzip encodes its repeat prompt with it), loaded once."""
        if self.tokenizer is None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(vi.model_config(self.runner).tokenizer)
        return self.tokenizer

    def gather(self, kv: dict[int, LayerKV], plan: KeepPlan, blocks: BlockIds, n: int, computed: int,
               protected: int) -> None:
        """Write each layer's kept entries to token offsets ``0 ... k - 1`` of its group's blocks, keys rotated by
        ``-(n - computed)``."""
        for index, layer in self.layers.items():
            stored = kv[index]
            prefix = torch.arange(protected, device=stored.keys.device)
            keep = torch.stack([torch.cat([prefix, h.to(prefix.device).long()]) for h in plan.layers[index]])
            expand = keep[..., None].expand(-1, -1, stored.keys.shape[-1])
            keys, values = stored.keys.gather(1, expand), stored.values.gather(1, expand)  # [H_kv, k, d]
            if n != computed:
                cos, sin = self.adapter.rope(torch.zeros(1, dtype=torch.float32, device=keys.device),
                                             torch.tensor([computed - n], device=keys.device))
                keys = apply_rope(keys.float(), cos, sin).to(keys.dtype)
            slots = self.layouts[index].slots(blocks[self.groups[index]], keys.shape[1], keys.device)
            vi.write_entries(layer, keys.transpose(0, 1).contiguous(), values.transpose(0, 1).contiguous(), slots)


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
        built.check_layers(len(adapter.attention_layers))
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
        chosen.score(state.served_context(handle, context_ids, blocks, protected, chosen, passes))
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

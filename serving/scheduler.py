"""The scheduler side of compaction: a compacted request becomes a k-token prompt whose cache is computed, and the
attention blocks past its kept entries go back to the pool."""

from __future__ import annotations

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec


class CompactingScheduler(Scheduler):
    """vLLM's scheduler plus :meth:`compact` (configured with ``scheduler_cls``; nothing else changes)."""

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

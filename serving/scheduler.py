"""The scheduler side of compaction: a compacted request becomes a prompt whose cache is computed, and each attention
layer's blocks past its kept entries go back to the pool; a compacted context is held in the pool and questions
attach to copies of it.

The engine is built with one KV-cache group per layer (:func:`serving.vllm_internals.per_layer_kv_cache_groups`),
so every attention layer has its own block list per request and keeps its own number of blocks."""

from __future__ import annotations

from . import vllm_internals as vi


class CompactingScheduler(vi.Scheduler):
    """vLLM's scheduler plus :meth:`compact`, :meth:`hold`, :meth:`attach`, :meth:`detach`, :meth:`release`
    (configured with ``scheduler_cls``; nothing else changes)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._offsets: dict[str, dict[int, int]] = {}
        vi.install_manager_offsets(self, self._offsets)

    def hold(self, request_id: str) -> tuple[list, ...]:
        """Take a reference on every block of ``request_id`` (all groups), so that they stay allocated with their
        contents after the request ends; :meth:`release` gives them back."""
        blocks = tuple(list(group) for group in vi.request_blocks(self, request_id))
        vi.take_references(block for group in blocks for block in group)
        return blocks

    def release(self, blocks: tuple[list, ...]) -> None:
        """Drop the references :meth:`hold` took."""
        vi.free_blocks(self, [block for group in blocks for block in group])

    def attach(self, request_id: str, computed: int, kept: dict[int, int]) -> tuple[list[int], ...]:
        """Give the waiting request ``request_id`` blocks for ``computed`` already-computed tokens (as for a KV
        load) and mark them computed, so that only the tokens after them are scheduled: every recurrent group its
        state, every attention group ``kept[group]`` entries (≤ ``computed``), and the same shift for the blocks its
        question tokens take. The caller fills the blocks (``CompactionWorker.hybridpress_attach``) before the next
        step and calls :meth:`detach` when the request ends. Returns the block ids per group."""
        request = self.requests[request_id]
        shifts = {group: computed - k for group, k in kept.items() if k != computed}
        if shifts:
            self._offsets[request_id] = shifts
        if vi.allocate_external(self, request, computed) is None:
            self._offsets.pop(request_id, None)
            raise RuntimeError(f"no free blocks for {computed} context entries: the pool has "
                               f"{vi.num_free_blocks(self)} free blocks")
        request.num_computed_tokens = computed
        return vi.block_ids(self, request_id)

    def detach(self, request_id: str) -> None:
        """Forget a finished request's shifts."""
        self._offsets.pop(request_id, None)

    def compact(self, request_id: str, computed: int, kept: dict[int, int]) -> dict[int, int]:
        """Shorten the prefilled ``request_id`` to ``computed`` tokens and free each attention group's blocks past
        its kept entries.

        Parameters
        ----------
        computed : int
            The request's computed count from now on (the largest kept count of any layer).
        kept : dict[int, int]
            Per attention group index, the entries that group's layer keeps (≤ ``computed``).

        Returns
        -------
        dict[int, int]
            Per attention group index, the blocks returned to the pool.
        """
        request = self.requests[request_id]
        n = request.num_prompt_tokens
        if request.num_computed_tokens != n or request.num_output_tokens != 1:
            raise RuntimeError(f"request {request_id} is not right after its prefill (computed "
                               f"{request.num_computed_tokens} of {n} prompt tokens, {request.num_output_tokens} "
                               "generated)")
        if not 0 < computed <= n or any(not 0 < k <= computed for k in kept.values()):
            raise ValueError(f"kept counts {kept} must be in [1, {computed}] and computed={computed} in [1, {n}]")
        managers, lists = vi.group_managers(self), vi.request_blocks(self, request_id)
        attention = {group for group, manager in enumerate(managers) if vi.is_attention_group(manager)}
        if set(kept) != attention:
            raise ValueError(f"kept counts for groups {sorted(kept)}; the attention groups are {sorted(attention)}")
        vi.shorten_request(request, computed)
        freed, tails = {}, []
        for group, k in kept.items():
            blocks, keep_blocks = lists[group], -(-k // managers[group].kv_cache_spec.block_size)
            tails.extend(blocks[keep_blocks:])
            freed[group] = len(blocks) - keep_blocks
            del blocks[keep_blocks:]
        vi.free_blocks(self, list(reversed(tails)))
        return freed

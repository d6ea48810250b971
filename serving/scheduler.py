"""The scheduler side of compaction: a prefilled context is held in the pool after its request ends, each attention
layer's blocks past its kept entries go back to the pool when it is compacted, and questions (and the passes a press
runs after the context) attach to copies of it.

The engine is built with one KV-cache group per layer (:func:`serving.vllm_internals.driver.per_layer_kv_cache_groups`),
so every attention layer has its own block list per request and keeps its own number of blocks."""

from __future__ import annotations

from .vllm_internals import driver as vi


class CompactingScheduler(vi.Scheduler):
    """vLLM's scheduler plus :meth:`hold`, :meth:`shrink`, :meth:`attach`, :meth:`detach`, :meth:`release`
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
        shifts = {group: computed - k for group, k in kept.items() if k != computed}
        if shifts:
            self._offsets[request_id] = shifts
        if not vi.allocate_computed(self, request_id, computed):
            self._offsets.pop(request_id, None)
            raise RuntimeError(f"no free blocks for {computed} context entries: the pool has "
                               f"{vi.num_free_blocks(self)} free blocks")
        return vi.block_ids(self, request_id)

    def detach(self, request_id: str) -> None:
        """Forget a finished request's shifts."""
        self._offsets.pop(request_id, None)

    def shrink(self, blocks: tuple[list, ...], kept: dict[int, int]) -> dict[int, int]:
        """Give back each attention group's blocks of a held context past its kept entries.

        Parameters
        ----------
        blocks : tuple of list
            The held context's blocks per group (:meth:`hold`); the attention groups' lists are shortened in place.
        kept : dict[int, int]
            Per attention group index, the entries that group's layer keeps (≥ 1).

        Returns
        -------
        dict[int, int]
            Per attention group index, the blocks returned to the pool.
        """
        block_sizes = vi.attention_block_sizes(self)
        if set(kept) != set(block_sizes):
            raise ValueError(f"kept counts for groups {sorted(kept)}; the attention groups are {sorted(block_sizes)}")
        if any(k < 1 for k in kept.values()):
            raise ValueError(f"kept counts {kept} must be >= 1")
        freed, tails = {}, []
        for group, k in kept.items():
            keep_blocks = -(-k // block_sizes[group])
            tails.extend(blocks[group][keep_blocks:])
            freed[group] = len(blocks[group]) - keep_blocks
            del blocks[group][keep_blocks:]
        vi.free_blocks(self, list(reversed(tails)))
        return freed

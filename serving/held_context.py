"""A context held in the vLLM engine's block pool (:class:`serving.engine.CompactingLLM`): its handle, its lengths and
kept counts, its blocks, the compaction's plan and what it cost."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class HeldContext:
    """A context held in the engine's block pool: uncompacted (:meth:`serving.engine.CompactingLLM.hold`) or
    compacted.

    Attributes
    ----------
    handle : str
        Which held context this is (one context may be held whole and at several kept fractions).
    context_hash : str
        SHA-256 of the context ids (as ``runtime.Parent.context_hash``).
    n : int
        Context tokens.
    protected : int
        The prefix every layer keeps whole (never scored).
    computed : int
        The context's length for vLLM: the largest kept count of any layer (a question's first token takes this
        position); ``n`` for an uncompacted context.
    kept : dict[int, int]
        Per attention layer, the entries each of its KV heads keeps (the protected prefix included).
    freed_blocks : dict[int, int]
        Per attention layer, its blocks returned to the pool by compaction (empty: uncompacted).
    free_blocks_before, free_blocks_after : int
        The pool's free-block count right before and after compaction.
    prefill_seconds, score_seconds, compact_seconds : float
        ``score_seconds`` includes the passes a press runs after the context (KVzip's reconstruction);
        ``compact_seconds`` covers those passes, scoring, planning, a copy of the context (when compacting one),
        the gather and freeing the tail.
    plan : dict
        ``{layer: [[kept body positions of head h]]}`` (empty: uncompacted).
    blocks : tuple of list
        Per KV-cache group, the pool blocks the context holds (its kept attention pages, its GDN state slots).
    context_ids : list of int
    """

    handle: str
    context_hash: str
    n: int
    protected: int
    computed: int
    kept: dict
    freed_blocks: dict = field(default_factory=dict)
    free_blocks_before: int = 0
    free_blocks_after: int = 0
    prefill_seconds: float = 0.0
    score_seconds: float = 0.0
    compact_seconds: float = 0.0
    plan: dict = field(repr=False, default_factory=dict)
    blocks: tuple = field(repr=False, default=())
    context_ids: list = field(repr=False, default_factory=list)

    @property
    def compacted(self) -> bool:
        return bool(self.plan)

"""A held context seen as the runtime's ``CachedContext``: what the bench harness asks of a parent or a child."""

from __future__ import annotations

import torch

from runtime import Answer

from .engine import CompactingLLM
from .held_context import HeldContext


class EngineCache:
    """Answers and teacher-forced distributions of one held context in a :class:`CompactingLLM`.

    Parameters
    ----------
    engine : CompactingLLM
    held : HeldContext
    tokenizer : optional
        Decodes answers to text.
    """

    def __init__(self, engine: CompactingLLM, held: HeldContext, tokenizer=None):
        self.engine, self.held, self.tokenizer = engine, held, tokenizer
        self.n, self.context_hash = held.n, held.context_hash

    @property
    def kv_nbytes(self) -> int:
        """Bytes of the kept keys and values (entries x heads, summed over layers, as the runtime counts them)."""
        return sum(self.held.kept.values()) * self.engine.geometry.layer_entry_bytes

    @property
    def recurrent_nbytes(self) -> int:
        return self.engine.geometry.state_bytes

    def answer(self, question_ids, max_new_tokens: int, eos_token_id: int | list[int] | None = None) -> Answer:
        """Greedy answer as ``CachedContext.answer``: the tokens (a stop token included), the text without it."""
        stop = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or ())
        tokens = self.engine.answer(self.held, _ids(question_ids), max_new_tokens, stop_token_ids=stop or None)
        text = self.tokenizer.decode([t for t in tokens if t not in stop]) if self.tokenizer is not None else None
        return Answer(tokens, text)

    def log_probs(self, ids) -> torch.Tensor:
        """``[L, V]`` float32 next-token log-probabilities after each token of ``ids``, as
        ``CachedContext.log_probs`` (the engine's, normalised again in float32 like the runtime's)."""
        return self.engine.log_probs(self.held, _ids(ids)).float().log_softmax(-1)

    def release(self) -> None:
        self.engine.release(self.held)


def _ids(ids) -> list[int]:
    return torch.as_tensor(ids).view(-1).tolist()

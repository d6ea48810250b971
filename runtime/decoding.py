"""Greedy decoding's terms, the same for one cache (:meth:`runtime.session.CachedContext.answer`) and a batch of them
(:class:`runtime.batch.PaddedBatch`): the answer, how many tokens it may take within the model's positions, the tokens
that end it, and the token a ``choose`` hook picked.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from .errors import ArgumentTypeError, UsageError, describe
from .options import whole


@dataclass
class Answer:
    """Greedy answer to one question: generated ``tokens`` and, when a tokenizer is known, ``text``."""

    tokens: list[int]
    text: str | None


def decode_budget(max_new_tokens, config, context_tokens: int, question_tokens: int,
                  question: str = "the question") -> int:
    """``max_new_tokens`` as an ``int``, checked before anything is decoded: an integer >= 1 (:func:`~.options.whole`),
    and the context, ``question`` and the answer within the model's positions (``max_position_embeddings``), as the
    bench checks its lengths: past them a model that never emits its end of sequence decodes for as long as it is
    told to, at positions it was never trained on. A :class:`~runtime.errors.UsageError` naming the numbers
    otherwise."""
    count = whole(max_new_tokens, "max_new_tokens", 1, text=False)
    limit = getattr(config, "max_position_embeddings", None)
    needed = context_tokens + question_tokens + count
    if limit is not None and needed > limit:
        room = limit - context_tokens - question_tokens
        advice = (f"give max_new_tokens <= {room} or a shorter context" if room >= 1 else
                  f"the context and {question} leave no position for an answer: give a shorter context or question")
        raise UsageError(f"the context ({context_tokens} tokens), {question} ({question_tokens}) and "
                         f"max_new_tokens={count} need {needed} positions; the model has {limit} "
                         f"(max_position_embeddings): {advice}")
    return count


def stop_tokens(eos_token_id) -> set[int]:
    """The token ids that end an answer: ``eos_token_id`` one id, a list of them, or None (none)."""
    if eos_token_id is None:
        return set()
    ids = [eos_token_id] if not isinstance(eos_token_id, (list, tuple, set)) else list(eos_token_id)
    if any(isinstance(i, bool) or not isinstance(i, numbers.Integral) for i in ids):
        raise ArgumentTypeError(f"eos_token_id must be a token id, a list of them or None, got "
                                f"{describe(eos_token_id)}")
    if any(i < 0 for i in ids):
        raise UsageError(f"eos_token_id must be token ids >= 0 (no answer could stop at another), got "
                         f"{describe(eos_token_id)}")
    return {int(i) for i in ids}


def chosen_token(value, vocab: int) -> int:
    """What a ``choose`` hook returned (:meth:`~runtime.session.CachedContext.answer`) as a token id: an integer of
    Python or numpy, or a one-element integer tensor, in ``[0, vocab)`` (fed back, another id would index past the
    embeddings); a :class:`~runtime.errors.UsageError` naming the value otherwise (a float is never rounded to an
    id)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not (
            value.is_floating_point() or value.is_complex() or value.dtype == torch.bool):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(f"choose must return a token id (an integer, or a one-element integer tensor), got "
                                f"{describe(value)}")
    if not 0 <= value < vocab:
        raise UsageError(f"choose returned {value}, not a token id of this model: ids must be in [0, {vocab})")
    return int(value)

"""A pipeline in kvpress's shape: one context, compressed once with no question in sight, then every question.

>>> pipe = pipeline(model, tokenizer)
>>> pipe(context, questions=["Who?", "When?"], press="gatesight", allocator="gate", compression_ratio=0.9)
['Alice', '1999']
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import allocators
from runtime import adapter_for, encode_text, prefill

from .base import Press
from .registry import get
from .selection import Selection, keep_fraction_from

_MARK = "\x00QUESTION\x00"


@dataclass
class CompressedContextPipeline:
    """Answers questions about a context from a compacted KV cache (one prefill, one child, greedy answers).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A model the runtime supports (Qwen3.5, Qwen3-Next, Qwen3, Llama).
    tokenizer : transformers tokenizer
        With a chat template, the context and each question are framed by it (the context opens the user turn, the
        question closes it); without one they are plain text, the question after a blank line.
    max_new_tokens : int
    """

    model: object
    tokenizer: object
    max_new_tokens: int = 64

    def frame(self, context: str) -> tuple[str, str, str]:
        """(text before the context, the context turn up to the question, text after the question)."""
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": context + "\n\n" + _MARK}],
                                                      add_generation_prompt=True, tokenize=False)
            before_question, after = text.split(_MARK)
            start = before_question.index(context)
            return before_question[:start], before_question[start:], after
        return "", context + "\n\n", ""

    def __call__(self, context: str, questions: list[str] | str, press="gatesight", allocator="flat",
                 compression_ratio: float | None = None, keep_fraction: float | None = None,
                 layer_weights: dict[int, float] | None = None, answer_prefix: str = "") -> list[str] | str:
        """Greedy answers to ``questions`` (a list, or one string) from the context compressed once by ``press``
        and ``allocator`` at ``compression_ratio`` (kvpress's: the evicted fraction) or ``keep_fraction``.
        ``answer_prefix`` opens every answer (as kvpress's pipeline does); it is not part of the returned text."""
        if not isinstance(context, str):
            raise TypeError(f"context must be a string (the text to compress), got {type(context).__name__}")
        single = isinstance(questions, str)
        if not single and not (isinstance(questions, (list, tuple))
                               and all(isinstance(q, str) for q in questions)):
            raise TypeError(f"questions must be a string or a list of strings, got {_shown(questions)}")
        questions = [questions] if single else list(questions)
        if not questions:
            raise ValueError("give at least one question")
        p = keep_fraction_from(keep_fraction, compression_ratio)
        press = get(press) if isinstance(press, str) else press
        if not isinstance(press, Press):
            raise TypeError(f"press must be a press name (e.g. 'gatesight') or a Press instance, got {_shown(press)}")
        allocator = allocators.get(allocator) if isinstance(allocator, str) else allocator
        if not isinstance(allocator, allocators.Allocator):
            raise TypeError(f"allocator must be an allocator name (e.g. 'flat') or an Allocator instance, got "
                            f"{_shown(allocator)}")
        prefix, body, suffix = self.frame(context)
        prefix_ids = encode_text(self.tokenizer, prefix)
        ids = torch.tensor(prefix_ids + encode_text(self.tokenizer, body))
        parent = prefill(self.model, ids, protected=len(prefix_ids), evidence=press.evidence(adapter_for(self.model)),
                         tokenizer=self.tokenizer)
        child = Selection(parent, press, layer_weights).fork(allocator, p) if p < 1 else parent
        eos = self.tokenizer.eos_token_id
        answers = [child.answer(torch.tensor(encode_text(self.tokenizer, q + suffix + answer_prefix)),
                                self.max_new_tokens, eos).text for q in questions]
        parent.release()
        child.release()
        return answers[0] if single else answers


def _shown(value) -> str:
    """A wrong argument as a message names it: a class (given where an instance belongs) says so."""
    if isinstance(value, type):
        return f"the class {value.__name__} (pass an instance: {value.__name__}())"
    return f"{type(value).__name__} {value!r}"[:120]


def pipeline(model, tokenizer, max_new_tokens: int = 64) -> CompressedContextPipeline:
    """kvpress-style entry point: ``pipeline(model, tokenizer)(context, questions=[...], press=..., ...)``."""
    return CompressedContextPipeline(model, tokenizer, max_new_tokens)

"""The transformers task ``hybrid-kv-press-text-generation``: kvpress's pipeline call, this runtime underneath.

Importing this module registers the task with transformers' public ``PIPELINE_REGISTRY`` (kvpress's own
``kv-press-text-generation`` stays as it is). A kvpress user switches by the task string::

    import presses.kvpress_pipeline  # noqa: F401 - registers the task
    pipe = pipeline("hybrid-kv-press-text-generation", model=model, device=device)
    pipe(context, question=question, press=KnormPress(compression_ratio=0.5))["answer"]

The arguments and the result are those of kvpress's ``KVPressTextGenerationPipeline`` (``question`` or
``questions``, ``answer_prefix``, ``max_new_tokens``, ``max_context_length``, ``enable_thinking``; ``{"answer": ...}``
or ``{"answers": [...]}``), and so is the framing (:func:`presses.pipeline.frame`) and the greedy decoding (kvpress
stops at the generation config's end-of-sequence tokens and decodes without special tokens). Underneath is this
project's protocol: the context is prefilled once with the press's evidence, compacted once with no question in
sight, and every question is answered from that child. ``press`` takes what :func:`presses.pipeline.resolve`
takes; the extra arguments ``allocator``, ``compression_ratio`` / ``keep_fraction`` (for this project's presses
and press names) and ``protected`` are this runtime's. A kvpress press keeps kvpress's count, max(1, ⌊n·(1 − r)⌋)
entries per head (:class:`presses.pipeline.Compression`). Where kvpress's pipeline runs (dense models), the answers
are the same for the same press wherever no two scores tie at the budget's edge: kvpress keeps what ``torch.topk``
returns among ties, this project the earlier positions (``tests/presses/test_kvpress_pipeline.py``, on SmolLM2 at
0.5, 0.7 and 0.9 too, and ``tests/presses/test_kvpress_parity.py``). Every argument is checked before any work, each
wrong one named with what it takes.
"""

from __future__ import annotations

import logging
import numbers

import torch
from transformers import AutoModelForCausalLM, Pipeline
from transformers.pipelines import PIPELINE_REGISTRY

from runtime import encode_text
from runtime.errors import ArgumentTypeError, UsageError
from runtime.options import whole

from .pipeline import CompressedContextPipeline, check_text, describe_argument, encode_context, frame, resolve

TASK = "hybrid-kv-press-text-generation"
logger = logging.getLogger(__name__)


class HybridKVPressPipeline(Pipeline):
    """kvpress's ``KVPressTextGenerationPipeline`` on this runtime (hybrid GDN + attention models included)."""

    _load_tokenizer = True

    def _sanitize_parameters(self, question: str | None = None, questions: list[str] | None = None,
                             answer_prefix: str | None = None, press=None, max_new_tokens: int = 50,
                             max_context_length: int | None = None, enable_thinking: bool = False, cache=None,
                             allocator=None, compression_ratio: float | None = None,
                             keep_fraction: float | None = None, protected: int | str = 0):
        """kvpress's arguments (its defaults) and this runtime's: ``allocator``, ``compression_ratio`` /
        ``keep_fraction``, and ``protected``, the leading context tokens every press keeps: 0 by default (kvpress's
        choice: every token is a candidate, so that a press keeps what it keeps in kvpress's pipeline), or
        ``"header"``, the chat template's text before the context (what :func:`presses.pipeline` keeps).

        Returns
        -------
        tuple[dict, dict, dict]
            The keyword arguments of :meth:`preprocess`, :meth:`_forward` and :meth:`postprocess`.
        """
        if question is not None and questions is not None:
            raise UsageError("give question or questions, not both")
        if question is not None:
            check_text("question", question)
        if questions is not None:  # a string would be taken character by character
            if not isinstance(questions, (list, tuple)) or not all(isinstance(q, str) for q in questions):
                raise ArgumentTypeError(f"questions must be a list of strings (one question: question=...), got "
                                        f"{describe_argument(questions)}")
            if not questions:
                raise UsageError("questions is empty; give at least one question (or question=... for one)")
        if answer_prefix is not None:
            check_text("answer_prefix", answer_prefix)
        if cache is not None:
            raise UsageError("cache= is kvpress's cache object; this runtime keeps its own (a parent and its "
                             "compacted child)")
        if not isinstance(enable_thinking, bool):
            raise ArgumentTypeError(f"enable_thinking must be True or False, got {describe_argument(enable_thinking)}")
        if protected != "header" and (isinstance(protected, bool) or not isinstance(protected, numbers.Integral)
                                      or protected < 0):
            raise UsageError(f"protected must be an integer >= 0 or 'header', got {protected!r}")
        max_new_tokens = whole(max_new_tokens, "max_new_tokens", 1, text=False)
        if max_context_length is None:
            max_context_length = min(self.tokenizer.model_max_length, int(1e10))  # kvpress's default
        max_context_length = whole(max_context_length, "max_context_length", 1, text=False)
        preprocess = {"questions": list(questions) if questions is not None else [question or ""],
                      "answer_prefix": answer_prefix or "",
                      "max_context_length": max_context_length, "enable_thinking": enable_thinking,
                      "protected": protected}
        forward = {"press": press, "allocator": allocator, "compression_ratio": compression_ratio,
                   "keep_fraction": keep_fraction, "max_new_tokens": max_new_tokens}
        return preprocess, forward, {"single_question": questions is None}

    def preprocess(self, context: str, questions: list[str], answer_prefix: str, max_context_length: int,
                   enable_thinking: bool, protected: int | str) -> dict:
        """The framed context's ids (truncated to ``max_context_length``, as kvpress does), how many of them are
        protected, and each question's ids (``question + suffix + answer_prefix``)."""
        check_text("context", context, "the text to compress")
        header, body, suffix = frame(self.tokenizer, context, enable_thinking)
        ids, header_tokens = encode_context(self.tokenizer, header, body)
        if len(ids) > max_context_length:
            logger.warning(f"Context length has been truncated from {len(ids)} to {max_context_length} tokens.")
            ids = ids[:max_context_length]
        if protected == "header" and header_tokens >= len(ids):  # else refused for a count the caller never gave
            raise UsageError(f"protected='header' keeps the chat template's header ({header_tokens} tokens), and the "
                             f"context holds {len(ids)} tokens (max_context_length={max_context_length}): nothing "
                             "past the header is left to compress; give a longer context or max_context_length")
        return {"context_ids": torch.tensor(ids), "protected": min(header_tokens, len(ids)) if protected == "header"
                else int(protected),
                "questions_ids": [torch.tensor(encode_text(self.tokenizer, q + suffix + answer_prefix))
                                  for q in questions]}

    def _forward(self, inputs: dict, press=None, allocator=None, compression_ratio: float | None = None,
                 keep_fraction: float | None = None, max_new_tokens: int = 50) -> list[str]:
        """Prefill once, compact once, answer every question greedily; the answers decoded as kvpress decodes."""
        compression = resolve(self.model, press, allocator, compression_ratio, keep_fraction)
        answers = CompressedContextPipeline(self.model, self.tokenizer, max_new_tokens).answer(
            inputs["context_ids"], inputs["protected"], inputs["questions_ids"], compression,
            eos_token_id=self.model.generation_config.eos_token_id)
        return [self.tokenizer.decode(a.tokens, skip_special_tokens=True) for a in answers]

    def postprocess(self, model_outputs: list[str], single_question: bool) -> dict:
        return {"answer": model_outputs[0]} if single_question else {"answers": model_outputs}


PIPELINE_REGISTRY.register_pipeline(TASK, pipeline_class=HybridKVPressPipeline, pt_model=AutoModelForCausalLM)

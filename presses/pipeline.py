"""A pipeline in kvpress's shape: one context, compressed once with no question in sight, then every question.

>>> pipe = pipeline(model, tokenizer)
>>> pipe(context, questions=["Who?", "When?"], press="gatesight", allocator="gate", compression_ratio=0.9)
['Alice', '1999']

The context and questions are framed as kvpress's ``KVPressTextGenerationPipeline`` frames them (:func:`frame`);
the transformers task of :mod:`presses.kvpress_pipeline` is this pipeline behind kvpress's call signature.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

import allocators
from allocators import Allocator
from runtime import Answer, adapter_for, encode_text, prefill
from runtime.decoding import decode_budget
from runtime.errors import ArgumentTypeError, UsageError, describe
from runtime.options import whole

from .base import Press
from .kvpress_adapter import KvpressScorer
from .kvpress_names import NAMES, kvpress_object
from .kvpress_wrappers import is_kvpress_press, translate
from .preparation import press_call
from .registry import KVPRESS_PREFIX, check_library_name, get
from .selection import Selection, check_layer_weights, check_layer_weights_read, keep_fraction_from


def frame(tokenizer, context: str, enable_thinking: bool = False) -> tuple[str, str, str]:
    """kvpress's framing of a context: (header, context text, question suffix).

    With a chat template, the context and then the question make up one user turn: the header is the template's
    text before the context, the suffix what follows the question (the end of the turn and the assistant's
    opening). Without one, the header is the tokenizer's BOS text and the suffix a newline. A question is sent as
    ``question + suffix + answer_prefix``, right after the context: nothing separates them (kvpress's README
    starts its question with a newline for that reason).
    """
    if tokenizer.chat_template is None:
        return tokenizer.bos_token or "", context, "\n"
    separator = "#" * (len(context) + 10)  # kvpress's: a run of '#' longer than any in the context
    text = tokenizer.apply_chat_template([{"role": "user", "content": context + separator}],
                                         add_generation_prompt=True, tokenize=False, enable_thinking=enable_thinking)
    before, suffix = text.split(separator)
    start = before.rfind(context)  # a template that rewrites the content leaves no header to protect
    return (before[:start], before[start:], suffix) if start >= 0 else ("", before, suffix)


def encode_context(tokenizer, header: str, body: str) -> tuple[list[int], int]:
    """The framed context's ids, encoded in one piece as kvpress encodes it, and how many of them the header's
    tokens are (as far as the context's encoding starts with them: a tokenizer may merge across the boundary)."""
    ids, header_ids = encode_text(tokenizer, header + body), encode_text(tokenizer, header)
    protected = next((i for i, (a, b) in enumerate(zip(header_ids, ids)) if a != b), min(len(header_ids), len(ids)))
    return ids, protected


@dataclass(frozen=True)
class Compression:
    """How the context is compressed: ``press`` and ``allocator`` at kept fraction ``keep_fraction`` (``press``
    None, or p = 1: the context is kept whole).

    ``kvpress_ratio``, set where the budget is a kvpress press's ``compression_ratio`` r, makes the budget kvpress's:
    each head keeps ``max(1, ⌊n·(1 − r)⌋)`` of n entries (``kvpress.utils.compute_n_kept``, what kvpress's
    ``ScorerPress.compress`` keeps), where the allocators here keep round(p·n).
    """

    press: Press | None
    allocator: Allocator | None
    keep_fraction: float
    kvpress_ratio: float | None = None

    def keep_fraction_for(self, n_body: int) -> float:
        """The kept fraction the allocator is given for a body of ``n_body`` entries: ``keep_fraction``, or the
        fraction whose round(p·n) is kvpress's count (k / n: within a rounding error of k, so it rounds to k)."""
        if self.kvpress_ratio is None:
            return self.keep_fraction
        from kvpress.utils import compute_n_kept

        return compute_n_kept(n_body, self.kvpress_ratio) / n_body


def resolve(model, press, allocator=None, compression_ratio: float | None = None,
            keep_fraction: float | None = None) -> Compression:
    """The :class:`Compression` that ``press`` and ``allocator`` name for ``model``.

    ``press``: a :class:`Press` or its name (``"gatesight"``); a kvpress press object (its ``compression_ratio``
    sets the budget, so neither ``compression_ratio`` nor ``keep_fraction`` may be given) or its name
    (``"kvpress:KnormPress"``, or a kvpress short name: ``"kvpress:knorm"``, ``"kvpress:adakv_snapkv"``), both
    translated by :func:`presses.kvpress_wrappers.translate`; or None (no compression).
    ``allocator``: a name or an :class:`~allocators.Allocator`; by default ``flat``, or the rule a kvpress
    press carries (PyramidKVPress's schedule; AdaKVPress and PerLayerCompressionPress fix it: another is refused).

    A kvpress press at a kvpress ``compression_ratio`` (the object's own, or the argument with a kvpress name) keeps
    kvpress's count, ⌊n·(1 − r)⌋ per head (:attr:`Compression.kvpress_ratio`), so that the drop-in pipeline keeps
    what kvpress's keeps; PerLayerCompressionPress's per-layer ratios are its allocator's weights instead
    (:mod:`presses.kvpress_wrappers`), and ``keep_fraction`` is this project's p, rounded.
    """
    # numpy's numbers are numbers: the checks downstream take Python's
    compression_ratio, keep_fraction = (None if value is None else _real(name, value) for name, value in
                                        (("compression_ratio", compression_ratio), ("keep_fraction", keep_fraction)))
    budget_given = compression_ratio is not None or keep_fraction is not None
    if press is None:
        if budget_given:
            raise UsageError("press=None keeps the whole context; name a press to compress it")
        return Compression(None, None, 1.0)
    if isinstance(allocator, str):
        allocator = allocators.get(allocator)
    if allocator is not None and not isinstance(allocator, Allocator):
        raise ArgumentTypeError(f"allocator must be an allocator name (e.g. 'flat') or an Allocator instance, got "
                                f"{describe_argument(allocator)}")
    named = isinstance(press, str) and press.startswith(KVPRESS_PREFIX)
    if named or is_kvpress_press(press):
        if named:  # built with its defaults; the budget comes from the arguments
            check_library_name(press)
            short = press.removeprefix(KVPRESS_PREFIX)
            translation = translate(kvpress_object(short) if short in NAMES else KvpressScorer.build(short),
                                    adapter_for(model))
            p, ratio = keep_fraction_from(keep_fraction, compression_ratio), compression_ratio
        elif budget_given:
            raise UsageError(f"the kvpress press {type(press).__name__} carries its compression_ratio; do not pass "
                             "compression_ratio or keep_fraction as well")
        else:
            translation = translate(press, adapter_for(model))
            p, ratio = translation.keep_fraction, press.compression_ratio
        if allocator is not None and translation.wrapper is not None:
            raise UsageError(f"kvpress {translation.wrapper} sets the allocator ({translation.allocator.name}); to "
                             f"use {allocator.name!r}, pass the press it wraps with allocator={allocator.name!r}")
        per_layer = translation.wrapper == "PerLayerCompressionPress"
        return Compression(translation.press, allocator or translation.allocator, p,
                           None if per_layer or ratio is None else float(ratio))
    press = get(press) if isinstance(press, str) else press
    if not isinstance(press, Press):
        raise ArgumentTypeError(f"press must be a press name (e.g. 'gatesight'), a Press instance or a kvpress press, "
                                f"got {describe_argument(press)}")
    return Compression(press, allocator or allocators.get("flat"), keep_fraction_from(keep_fraction, compression_ratio))


def _real(name: str, value) -> float:
    """``value`` as a float if it is a real number (Python's or numpy's); an error naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"{name} must be a number (compression_ratio: the evicted fraction, in [0, 1); "
                                f"keep_fraction: the kept one, in (0, 1]), got {describe_argument(value)}")
    return float(value)


@dataclass
class CompressedContextPipeline:
    """Answers questions about a context from a compacted KV cache (one prefill, one child, greedy answers).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A model the runtime supports (Qwen3.5, Qwen3.5-MoE, Qwen3-Next, Qwen3, Llama).
    tokenizer : transformers tokenizer
        Frames the context and each question (:func:`frame`) and decodes the answers.
    max_new_tokens : int
    """

    model: object
    tokenizer: object
    max_new_tokens: int = 64

    def __post_init__(self):
        self.max_new_tokens = whole(self.max_new_tokens, "max_new_tokens", 1, text=False)
        check_model(self.model)
        check_tokenizer(self.tokenizer)

    def answer(self, context_ids: torch.Tensor, protected: int, questions_ids: list[torch.Tensor],
               compression: Compression, layer_weights: dict[int, float] | None = None,
               eos_token_id: int | list[int] | None = None) -> list[Answer]:
        """The protocol: prefill ``context_ids`` once with the press's evidence (its first ``protected`` tokens
        kept), compact once, answer every question greedily from the one child. A request that cannot fit the
        model's positions is refused first (:func:`check_positions`)."""
        max_new_tokens = check_positions(self.model, len(context_ids), questions_ids, self.max_new_tokens)
        check_layer_weights(layer_weights, tuple(adapter_for(self.model).attention_layers))  # before the prefill
        check_layer_weights_read(layer_weights, compression.allocator)
        press = compression.press
        if press is not None:
            press_call(press, "check_context", len(context_ids))
        evidence = press_call(press, "evidence", adapter_for(self.model)) if press is not None else None
        parent = prefill(self.model, context_ids, protected=protected, tokenizer=self.tokenizer,
                         **({"evidence": evidence} if evidence is not None else {}))
        child = parent
        keep_fraction = compression.keep_fraction_for(parent.n - parent.protected)
        if press is not None and keep_fraction < 1:
            child = Selection(parent, press, layer_weights).fork(compression.allocator, keep_fraction)
        answers = [child.answer(ids, max_new_tokens, eos_token_id) for ids in questions_ids]
        parent.release()
        child.release()
        return answers

    def __call__(self, context: str, questions: list[str] | str, press="gatesight", allocator=None,
                 compression_ratio: float | None = None, keep_fraction: float | None = None,
                 layer_weights: dict[int, float] | None = None, answer_prefix: str = "") -> list[str] | str:
        """Greedy answers to ``questions`` (a list, or one string) from the context compressed once by ``press``
        and ``allocator`` (:func:`resolve`) at ``compression_ratio`` (kvpress's: the evicted fraction) or
        ``keep_fraction``; the template's header before the context is kept. ``answer_prefix`` opens every answer
        (as kvpress's pipeline does); it is not part of the returned text."""
        check_text("context", context, "the text to compress")
        check_text("answer_prefix", answer_prefix)
        single = isinstance(questions, str)
        if not single and not (isinstance(questions, (list, tuple))
                               and all(isinstance(q, str) for q in questions)):
            raise ArgumentTypeError(f"questions must be a string or a list of strings, got "
                                    f"{describe_argument(questions)}")
        questions = [questions] if single else list(questions)
        if not questions:
            raise UsageError("give at least one question")
        compression = resolve(self.model, press, allocator, compression_ratio, keep_fraction)
        header, body, suffix = frame(self.tokenizer, context)
        ids, protected = encode_context(self.tokenizer, header, body)
        if protected >= len(ids):  # else refused by prefill for a protected count the caller never gave
            raise UsageError(f"context {context!r} adds no token to the chat template's header: give a text to "
                             "compress")
        questions_ids = [torch.tensor(encode_text(self.tokenizer, q + suffix + answer_prefix)) for q in questions]
        answers = self.answer(torch.tensor(ids), protected, questions_ids, compression, layer_weights,
                              self.tokenizer.eos_token_id)
        texts = [a.text for a in answers]
        return texts[0] if single else texts


def check_positions(model, context_tokens: int, questions_ids: list[torch.Tensor], max_new_tokens) -> int:
    """``max_new_tokens`` as an ``int``, checked before any work as each answer checks it
    (:func:`runtime.decoding.decode_budget`) for the longest question: an integer >= 1, and the context, the longest
    question and its answer within the model's positions."""
    longest = max(len(ids) for ids in questions_ids)
    limit = getattr(model.config, "max_position_embeddings", None)
    # no max_new_tokens helps then: say what is too long, not an answer budget below 1
    if limit is not None and context_tokens >= limit:
        raise UsageError(f"the context alone takes {context_tokens} tokens of the model's {limit} positions "
                         "(max_position_embeddings), leaving none for a question and its answer: give a shorter "
                         "context")
    if limit is not None and context_tokens + longest >= limit:
        raise UsageError(f"the context ({context_tokens} tokens) and the longest question ({longest}) take "
                         f"{context_tokens + longest} of the model's {limit} positions (max_position_embeddings), "
                         "leaving none for an answer: give a shorter context or question")
    return decode_budget(max_new_tokens, model.config, context_tokens, longest, "the longest question")


TOKENIZER_NEEDS = ("chat_template", "bos_token", "apply_chat_template", "decode", "__call__")
"""What the pipeline reads of a tokenizer: its chat template frames the context (:func:`frame`), calling it encodes
(:func:`runtime.encode_text`), ``decode`` gives the answers' text."""


def check_model(model) -> None:
    """An error naming ``model`` unless it is a torch module with a transformers config (which family it is, and
    whether the runtime supports it, :func:`runtime.adapter_for` says when it is first used)."""
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise ArgumentTypeError(f"model must be a transformers causal LM (AutoModelForCausalLM.from_pretrained) of "
                                f"a family the runtime supports, got {describe_argument(model)}")


def check_tokenizer(tokenizer) -> None:
    """An error naming ``tokenizer`` unless it is a transformers tokenizer (what the pipeline reads of one:
    :data:`TOKENIZER_NEEDS`)."""
    missing = [name for name in TOKENIZER_NEEDS if not hasattr(tokenizer, name)]
    if missing:
        raise ArgumentTypeError(f"tokenizer must be the model's transformers tokenizer (AutoTokenizer.from_pretrained"
                                f"; it frames the context with its chat template and decodes the answers), got "
                                f"{describe_argument(tokenizer)}, which has no {', '.join(missing)}")


def check_text(name: str, value, what: str | None = None) -> None:
    """An error naming ``name`` unless ``value`` is a string (``what`` says what it holds)."""
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be a string{f' ({what})' if what else ''}, got {describe(value)}")


def describe_argument(value) -> str:
    """A wrong argument as a message names it (:func:`runtime.errors.describe`): a class given where an instance
    belongs says how to make one."""
    shown = describe(value)
    return f"{shown} (pass an instance: {value.__name__}())" if isinstance(value, type) else shown


def pipeline(model, tokenizer, max_new_tokens: int = 64) -> CompressedContextPipeline:
    """kvpress-style entry point: ``pipeline(model, tokenizer)(context, questions=[...], press=..., ...)``."""
    return CompressedContextPipeline(model, tokenizer, max_new_tokens)

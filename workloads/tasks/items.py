"""Benchmark items: one context, all of its questions, and the chat framing shared by every task."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from runtime import CHATML_ASSISTANT_TURN
from runtime.errors import UsageError

CONTEXT_TEMPLATE = "<|im_start|>user\n{header}\n\n{body}\n\n"
PROTECTED_TEMPLATE = "<|im_start|>user\n{header}\n\n"
QUESTION_TEMPLATE = "{text}" + CHATML_ASSISTANT_TURN + "{prefix}"


@dataclass
class Question:
    """One question about a context: its text, the answer prefix the model continues, references, budget.

    Attributes
    ----------
    text : str
        The question.
    prefix : str
        What the assistant's turn starts with; the model continues it.
    answers : list[str]
        Reference answers (the first one is teacher-forced for the fidelity metrics).
    max_new_tokens : int
        The answer's token budget.
    scorer, official : Callable[[str], float], optional
        Task-specific scorers of a prediction (SCBench's revised and official); RULER uses the item's metric.
    needles : list[str]
        The needle sentences of the context that carry the answer (NIAH), for the needle-recall diagnostic.
    """

    text: str
    prefix: str
    answers: list[str]
    max_new_tokens: int
    scorer: Callable[[str], float] | None = field(default=None, repr=False)
    official: Callable[[str], float] | None = field(default=None, repr=False)
    needles: list[str] = field(default_factory=list)

    @property
    def prompt(self) -> str:
        """What is appended to the (compacted) context: never part of the compressed prefix."""
        return QUESTION_TEMPLATE.format(text=self.text, prefix=self.prefix)


@dataclass
class Item:
    """A benchmark context with every question asked of it.

    Attributes
    ----------
    header : str
        The task instruction; with the chat prefix it forms the protected prefix that every method keeps.
    body : str
        The haystack (needles, documents, lists) that compression may evict.
    haystack : str
        What the filler text is: ``generated`` by this project, or the real source it was drawn from.
    """

    task: str
    header: str
    body: str
    questions: list[Question]
    metric: str
    index: int = 0
    seed: int = 0
    meta: dict = field(default_factory=dict)
    haystack: str = "generated"

    @property
    def context(self) -> str:
        return CONTEXT_TEMPLATE.format(header=self.header, body=self.body)

    @property
    def protected_text(self) -> str:
        return PROTECTED_TEMPLATE.format(header=self.header)


def fit_units(
    render: Callable[[int], str],
    header: str,
    questions: list[Question],
    cfg,
    grow: Callable[[int], int] | None = None,
) -> str:
    """Largest haystack (in units) whose context plus longest question plus generation fits ``cfg.length`` tokens.

    As RULER does, the budget covers the input and the tokens to generate. ``render(units)`` must be deterministic.
    """
    longest = max(cfg.count_tokens(q.prompt) + q.max_new_tokens for q in questions)

    def fits(units: int) -> bool:
        context = CONTEXT_TEMPLATE.format(header=header, body=render(units))
        return cfg.count_tokens(context) + longest <= cfg.length

    if not fits(1):
        least = cfg.count_tokens(CONTEXT_TEMPLATE.format(header=header, body=render(1))) + longest
        raise UsageError(f"length {cfg.length} is too short for even one haystack unit of this task: it needs about "
                         f"{least} tokens (the framing, one unit, the longest question and its answer; the words "
                         "drawn differ a little from one length to another)")
    low, high = 1, 2
    while fits(high):
        # every unit adds text (a line, a word, a document), so more units than the length's tokens that still
        # fit mean a pool the units are drawn from without repeats ran out (cwe's words): the haystack stopped growing
        if high > 4 * cfg.length:
            most = cfg.count_tokens(CONTEXT_TEMPLATE.format(header=header, body=render(high))) + longest
            raise UsageError(f"length {cfg.length} is more than this task's haystack can fill: it stops growing at "
                             f"about {most} tokens (the framing, every unit it can draw, the longest question and "
                             "its answer); give a shorter length")
        low, high = high, (grow(high) if grow else high * 2)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return render(low)

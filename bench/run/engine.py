"""The back ends a context of a comparison runs on, behind one small interface.

:class:`~bench.run.context_run.ContextRun` runs the protocol — prefill once, the full cache's references, then every
compacted child answered question by question — through :class:`Engine` alone: :meth:`Engine.prefill` gives a
:class:`HeldContext` that answers for the full cache and yields the compacted children in :class:`ChildGroup` s.
:class:`RuntimeEngine` is this project's runtime (children forked from scored :class:`~presses.Selection` s and
answered as padded batches); :class:`bench.run.served_engine.ServedEngine` compacts inside vLLM.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from presses import Press
from presses.context_guard import check_kept, fingerprint, kept_parts
from presses.score_check import press_label
from presses.selection import Selection
from pretrained.model_info import ModelInfo
from runtime import Answer, Evidence, EvidenceRequest, KeepPlan, prefill
from runtime.batch import PaddedBatch, answer_and_follow_many
from runtime.batch_memory import DEFAULT_MEMORY_BUDGET, groups_within

from .fidelity import log_probs_of
from .needles import needle_rank
from .specs import AllocatorSpec, Method, PressSpec

Child = tuple[Method, float]
"""One compacted child of a context: its method and kept fraction."""


@dataclass(frozen=True)
class Compacted:
    """What the rows of one compacted child record of it.

    Attributes
    ----------
    child : Child
    plan : KeepPlan
        Which body entries each attention layer and head kept.
    kv_bytes, recurrent_bytes : int
        The child's attention cache and the recurrent state of its GDN and Mamba2 layers.
    score_seconds : float
        Its press's scoring of the context.
    rank : Callable
        ``rank(question)``: the answer tokens' rank under the press's scores (:func:`bench.run.needles.needle_rank`),
        None where the scores stay in the engine.
    """

    child: Child
    plan: KeepPlan
    kv_bytes: int
    recurrent_bytes: int
    score_seconds: float
    rank: Callable[[object], dict | None]


class ChildGroup(Protocol):
    """Compacted children of one context answered together."""

    members: list[Compacted]

    def answer(self, question, which: list[int]) -> tuple[list[Answer], list[torch.Tensor]]:
        """Greedy answers of members ``which`` to ``question`` (a :class:`~bench.run.rows.QuestionReference`), and
        each one's log-probabilities ``[A, V]`` of the reference answer teacher-forced."""

    def release(self) -> None:
        """Free the children's caches."""


class HeldContext(Protocol):
    """A context prefilled whole: the full cache, its size and time, and its compacted children."""

    n: int
    prefill_seconds: float
    kv_nbytes: int
    recurrent_nbytes: int
    scored_by: tuple[str, ...]
    """The labels of the presses that scored the context here, in order (none where the engine scores it)."""

    def check_kept(self) -> None:
        """A :class:`~runtime.user_code.UserCodeError` where the context changed since its presses scored it: its rows
        are made from it, and none may be written."""

    def reference(self, prompt_ids: torch.Tensor, answer_ids: torch.Tensor, max_new_tokens: int,
                  eos_token_id) -> tuple[Answer, torch.Tensor]:
        """The full cache's greedy answer to a question and the reference answer's log-probabilities ``[A, V]``."""

    def groups(self, children: list[Child], questions: list) -> Iterator[ChildGroup]:
        """Every child of ``children``, in groups answered one after another."""

    def release(self) -> None: ...


class Engine(Protocol):
    def prefill(self, context_ids: torch.Tensor, protected: int, presses: list[PressSpec]) -> HeldContext:
        """``context_ids`` ``[n]`` prefilled once with what every press of ``presses`` reads; the first
        ``protected`` tokens are kept by every child."""


class RuntimeEngine:
    """This project's runtime on a transformers model: one prefill with the presses' evidence, one
    :class:`~presses.Selection` per press, children forked and answered in groups of at most ``batch`` within
    :attr:`memory_budget` (:func:`runtime.batch_memory.groups_within`), each group one padded batch.

    Parameters
    ----------
    model, tokenizer
    presses : dict[PressSpec, Press]
        Built, bound and checked once (:class:`~bench.run.harness.Harness`).
    allocators : dict[AllocatorSpec, Allocator]
    layer_weights : dict[int, float] or None
        The calibrated gate weights, when an allocator reads them.
    evidence : EvidenceRequest
        What the prefill records for every press.
    batch : int
        Children of a group at most.
    model_info : ModelInfo, optional
        The model as the run read it once (:class:`~pretrained.model_info.ModelInfo`): each context's selections
        are bound to it, reading nothing of its directory again.
    """

    memory_budget = DEFAULT_MEMORY_BUDGET
    """Bytes one group of children may hold (:func:`runtime.batch_memory.groups_within`)."""

    def __init__(self, model, tokenizer, presses: dict[PressSpec, Press], allocators: dict[AllocatorSpec, object],
                 layer_weights: dict[int, float] | None, evidence: EvidenceRequest, batch: int,
                 model_info: ModelInfo | None = None):
        self.model, self.tokenizer, self.presses, self.allocators = model, tokenizer, presses, allocators
        self.layer_weights, self.evidence, self.batch = layer_weights, evidence, batch
        self.model_info = model_info

    def prefill(self, context_ids: torch.Tensor, protected: int, presses: list[PressSpec]) -> _RuntimeContext:
        t0 = time.perf_counter()
        parent = prefill(self.model, context_ids, protected=protected, evidence=self.evidence,
                         tokenizer=self.tokenizer)
        return _RuntimeContext(self, parent, time.perf_counter() - t0, presses)


class _RuntimeContext:
    """A :class:`HeldContext` of :class:`RuntimeEngine`: the prefilled parent, scored by each press at once."""

    def __init__(self, engine: RuntimeEngine, parent, prefill_seconds: float, presses: list[PressSpec]):
        self.engine, self.parent, self.prefill_seconds = engine, parent, prefill_seconds
        self.n, self.kv_nbytes, self.recurrent_nbytes = parent.n, parent.kv_nbytes, parent.recurrent_nbytes
        self.selections = {spec: Selection(parent, engine.presses[spec], engine.layer_weights, engine.model_info)
                           for spec in presses}
        scored = None
        for selection in self.selections.values():
            selection.fingerprinted = scored  # as the press before left it, checked
            selection.scores  # noqa: B018 - scored now, so that the evidence can go before any child is made
            scored = selection.fingerprinted
        self.scored_by = tuple(press_label(selection.press) for selection in self.selections.values())
        # what every row of the context is made from (its evidence aside: it goes now)
        self._scored = kept_parts(scored or fingerprint(parent))
        # what the presses read of the prefill (kvpress's presses: every attention layer's hidden states, 133 MiB
        # at 2,048 tokens on SmolLM2-135M) is not needed once every press has scored
        parent.evidence = Evidence()
        self._ranks: dict[tuple[int, int], dict] = {}  # (press's selection, question) -> needle rank

    def reference(self, prompt_ids, answer_ids, max_new_tokens: int, eos_token_id) -> tuple[Answer, torch.Tensor]:
        # one pass over the question feeds both the greedy answer and the teacher-forced answer
        answers, logits = answer_and_follow_many([self.parent], prompt_ids, answer_ids, max_new_tokens, eos_token_id)
        return answers[0], log_probs_of(logits[0])

    def _rank(self, selection: Selection, question) -> dict:
        """The answer tokens' rank under a press's scores: it depends on the press and the question only, so it is
        computed once for all of a press's children."""
        key = (id(selection), id(question))
        if key not in self._ranks:
            self._ranks[key] = needle_rank(selection.scores, question.answer_tokens, self.parent.protected)
        return self._ranks[key]

    def groups(self, children: list[Child], questions: list) -> Iterator[_RuntimeGroup]:
        # similar kept fractions side by side: a batch is padded to its largest child
        children = sorted(children, key=lambda child: child[1])
        # a question's pass is followed by its greedy answer, and apart by the reference answer teacher-forced
        forced = max(q.reference.answer_ids.numel() for q in questions)
        tokens = max(q.prompt_ids.numel() + max(q.question.max_new_tokens, forced) for q in questions)
        allocators = self.engine.allocators
        plans = ((child, self.selections[child[0].press].plan(allocators[child[0].allocator], child[1]))
                 for child in children)
        for group in groups_within(self.parent, plans, tokens, forced, self.engine.memory_budget, self.engine.batch):
            yield _RuntimeGroup(self, group)

    def check_kept(self) -> None:
        # probe 13: a press's thread changed the cache it kept after the check around its scoring
        check_kept(self._scored, kept_parts(fingerprint(self.parent)), self.scored_by)

    def release(self) -> None:
        self.parent.release()


class _RuntimeGroup:
    """Children forked into one padded batch, each released as soon as it is in it (:meth:`PaddedBatch.forks`)."""

    def __init__(self, context: _RuntimeContext, group: list[tuple[Child, KeepPlan]]):
        self.members: list[Compacted] = []
        self.eos = context.engine.tokenizer.eos_token_id

        def forked(i: int, cache) -> None:
            child, plan = group[i]
            selection = context.selections[child[0].press]
            self.members.append(Compacted(child, plan, cache.kv_nbytes, cache.recurrent_nbytes,
                                          selection.score_seconds, lambda q: context._rank(selection, q)))

        self.batch = PaddedBatch.forks(context.parent, [plan for _, plan in group], forked)

    def answer(self, question, which: list[int]) -> tuple[list[Answer], list[torch.Tensor]]:
        # one pass over the question feeds both the greedy answer and the teacher-forced reference answer
        answers, logits = self.batch.answer_and_follow(question.prompt_ids, question.reference.answer_ids,
                                                       question.question.max_new_tokens, self.eos, which)
        return answers, list(log_probs_of(logits))

    def release(self) -> None:
        self.batch = None

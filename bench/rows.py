"""The stored rows of a comparison, built the same way for every engine.

A row is one question answered from one child: the run's identity and shape (:func:`base_row`, :func:`run_of`), the
method and the child's size (:func:`method_fields`), accuracy and fidelity against the full cache, and, on NIAH
tasks, which answer-bearing entries the child kept (:func:`needle_fields`).
"""

from __future__ import annotations

from typing import Callable

import torch

from runtime import Answer, KeepPlan
from runtime.batch import answer_and_follow_many
from runtime.session import CachedContext
from workloads.metrics import METRICS
from workloads.tasks import registry as tasks
from workloads.tasks.items import Item, Question

from .fidelity import FullCacheReference, answer_log_probs, fidelity, log_probs_of, reference_text
from .needles import evidence_positions, mean_over_heads, needle_recall
from .store import RUN, SCHEMA


def run_of(settings) -> dict:
    """The run a row names (:data:`bench.store.RUN`): the tasks (groups expanded, in order), ``n`` and haystack of
    ``settings`` (a :class:`~bench.settings.CompareSettings`), and its shard ``k`` of ``N`` (0 of 1 unsharded)."""
    k, count = settings.shard or (0, 1)
    return {"tasks": tasks.expand(settings.tasks), "n": settings.n, "haystack": settings.haystack, "shard": k,
            "shards": count}


def base_row(harness, task: str, item: Item, question_index: int) -> dict:
    """The fields every row of one question of one context shares, whatever the method."""
    s = harness.settings
    return {"schema": SCHEMA, "model": str(harness.model_dir.name), **harness.identity.row_fields(), "task": task,
            "profile": s.profile, "length": s.length, "item": item.index, "question": question_index, "seed": s.seed,
            "code": harness.code, "engine": s.engine, "dtype": harness.dtype, "device": harness.device,
            "haystack": item.haystack, RUN: run_of(s)}


def method_fields(press: str, allocator: str, keep_fraction: float, common: dict, cache: CachedContext,
                  kept_entries: int | None = None, score_seconds: float | None = None) -> dict:
    """The fields of one child: its method, the context's timings and sizes, and the child's bytes.

    ``kept_entries`` and ``score_seconds`` are those of a compacted child (absent for no prune).
    """
    fields = {"press": press, "allocator": allocator, "keep_fraction": keep_fraction, **common}
    if score_seconds is not None:
        fields["score_seconds"] = round(score_seconds, 4)
        fields["kept_entries"] = kept_entries
    # ``gdn_bytes`` holds the recurrent state of the GDN and Mamba2 layers alike (``recurrent_nbytes``); the row
    # field keeps its old name because the committed stores (docs/results, docs/realmodel) carry it
    return {**fields, "kv_bytes": cache.kv_nbytes, "gdn_bytes": cache.recurrent_nbytes}


class QuestionReference:
    """One question of an item, encoded, with its full-cache reference computed once from the parent.

    Parameters
    ----------
    question : Question
    parent : CachedContext or an engine's held context
        The full cache; it is not changed.
    context : str
        The context's text (to find the needle sentences' positions).
    encode : Callable[[str], list[int]]
    eos_token_id : int or None

    Attributes
    ----------
    prompt_ids : torch.Tensor
        ``[L]`` the question's prompt.
    reference : FullCacheReference
        The teacher-forced reference answer's log-probabilities under the full cache, and its greedy answer.
    answer : Answer
        The full cache's greedy answer: the no-prune row's answer (a keep-all child gives exactly this).
    evidence, answer_tokens : list[int] or None
        Context positions of the needle sentences and of the answer's tokens (None when the task has none).
    """

    def __init__(self, question: Question, parent, context: str, encode: Callable[[str], list[int]],
                 eos_token_id):
        self.question = question
        self.prompt_ids = torch.tensor(encode(question.prompt), dtype=torch.long)
        self.evidence = self.answer_tokens = None
        if question.evidence:
            self.evidence = evidence_positions(encode, context, question.evidence)
            self.answer_tokens = evidence_positions(encode, context, question.evidence, question.answers)
        answer_ids = torch.tensor(encode(reference_text(question.prefix, question.answers[0])), dtype=torch.long)
        if isinstance(parent, CachedContext):  # the runtime's: one pass over the question feeds both
            answers, logits = answer_and_follow_many([parent], self.prompt_ids, answer_ids, question.max_new_tokens,
                                                     eos_token_id)
            self.answer, log_probs = answers[0], log_probs_of(logits[0])
        else:  # a context held in an engine answers and scores in two requests
            self.answer = parent.answer(self.prompt_ids, question.max_new_tokens, eos_token_id)
            log_probs = answer_log_probs(parent, self.prompt_ids, answer_ids)
        self.reference = FullCacheReference(answer_ids, log_probs, self.answer.tokens)


def needle_fields(q: QuestionReference, plan: KeepPlan, rank: Callable[[], dict | None]) -> dict:
    """Needle recall of a compacted child's plan on one question (:mod:`bench.needles`); ``rank()`` gives the
    answer tokens' rank under the press's scores (None where the scores stay in the engine)."""
    if q.evidence is None:
        return {}
    sentence, answer = needle_recall(plan, q.evidence), needle_recall(plan, q.answer_tokens)
    return {"needle_recall": mean_over_heads(sentence), "needle_recall_layers": sentence,
            "answer_recall": mean_over_heads(answer), "answer_recall_layers": answer, "answer_rank_layers": rank()}


def answered_row(item: Item, q: QuestionReference, row: dict, method: dict, answer: Answer,
                 log_probs: torch.Tensor, needles: dict | None = None) -> dict:
    """The stored row of one answered question: accuracy, fidelity against the full cache (``log_probs``:
    ``[A, V]`` at the reference answer's positions), the prediction, and the needle diagnostics if any."""
    question = q.question
    scores = {"score": question.scorer(answer.text)} if question.scorer else {
        "score": METRICS[item.metric](answer.text, question.answers)}
    if question.official:
        scores["score_official"] = question.official(answer.text)
    scores.update(fidelity(q.reference, log_probs, answer.tokens))
    return {**row, **method, **scores, **(needles or {}), "prediction": answer.text, "answers": question.answers}

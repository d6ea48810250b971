"""The stored rows of a comparison, built the same way for every engine.

A row is one question answered from one child: the run's identity and shape (:func:`base_row`), the
method and the child's size (:func:`method_fields`), accuracy and fidelity against the full cache, and, on NIAH
tasks, which answer-bearing entries the child kept (:func:`needle_fields`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Callable

import torch

from pretrained.loading import ModelIdentity
from runtime import Answer, KeepPlan
from workloads.metrics import METRICS
from workloads.tasks.items import Item, Question

from ..store.row_fields import BATCH, METHOD_CODE, QUESTIONS, RUN, SCHEMA, mean_over_heads
from .fidelity import FullCacheReference, fidelity, reference_text
from .needles import needle_positions, needle_recall
from .plan import RunPlan
from .specs import Method


def base_row(run: RunPlan, identity: ModelIdentity, task: str, item: Item, question_index: int) -> dict:
    """The fields every row of one question of one context shares, whatever the method: the run's (``run``), the
    model's (``identity``: its fingerprints, computed once), the question's and how many the context has
    (:data:`~bench.store.row_fields.QUESTIONS`)."""
    return {"schema": SCHEMA, "model": str(run.model_dir.name), **identity.row_fields(), "task": task,
            "profile": run.profile, "length": run.length, "item": item.index, "question": question_index,
            QUESTIONS: len(item.questions), "seed": run.seed, "code": run.code, "engine": run.engine,
            "dtype": run.dtype, "device": run.device, "haystack": item.haystack, RUN: run.run}


def method_fields(method: Method, method_code: str, keep_fraction: float, common: dict, kv_bytes: int,
                  recurrent_bytes: int, kept_entries: int | None = None, score_seconds: float | None = None) -> dict:
    """The fields of one child: its method (the specs' labels and its own code,
    :data:`~bench.store.row_fields.METHOD_CODE`), the context's timings and sizes, and the child's
    bytes (``kv_bytes`` of attention cache, ``recurrent_bytes`` of the recurrent state of its GDN and Mamba2 layers
    alike: ``recurrent_nbytes``; rows stored before it was named so hold it as ``gdn_bytes``,
    :data:`bench.store.legacy_rows.LEGACY_NAMES`).

    ``kept_entries`` and ``score_seconds`` are those of a compacted child (absent for no prune).
    """
    fields = {"press": method.press.label, "allocator": method.allocator.label, "keep_fraction": keep_fraction,
              **common, METHOD_CODE: method_code}
    if score_seconds is not None:
        fields["score_seconds"] = round(score_seconds, 4)
        fields["kept_entries"] = kept_entries
    return {**fields, "kv_bytes": kv_bytes, "recurrent_bytes": recurrent_bytes}


def batch_digest(forked: list[dict], answered: list[dict]) -> dict:
    """The :data:`~bench.store.row_fields.BATCH` field of the rows of one padded batch's pass over a question: a digest
    of the children ``forked`` into it (which set its padded shapes) and of those ``answered`` in the pass, each by its
    :func:`method_fields` (press, allocator, kept fraction)."""
    def label(method: dict) -> list:
        return [method["press"], method["allocator"], method["keep_fraction"]]
    text = json.dumps([sorted(map(label, forked)), sorted(map(label, answered))])
    return {BATCH: hashlib.sha256(text.encode()).hexdigest()[:16]}


class QuestionReference:
    """One question of an item, encoded, with its full-cache reference computed once from the parent.

    Parameters
    ----------
    question : Question
    parent : bench.run.engine.HeldContext
        The full cache (of either engine); it is not changed.
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
    needle_positions, answer_tokens : torch.Tensor or None
        ``[m]`` context positions of the tokens of the needle sentences and of the answer's tokens within them (None
        when the task has no needles).
    """

    def __init__(self, question: Question, parent, context: str, encode: Callable[[str], list[int]],
                 eos_token_id):
        self.question = question
        self.prompt_ids = torch.tensor(encode(question.prompt), dtype=torch.long)
        self.needle_positions = self.answer_tokens = None
        if question.needles:
            self.needle_positions = needle_positions(encode, context, question.needles)
            self.answer_tokens = needle_positions(encode, context, question.needles, question.answers)
        answer_ids = torch.tensor(encode(reference_text(question.prefix, question.answers[0])), dtype=torch.long)
        self.answer, log_probs = parent.reference(self.prompt_ids, answer_ids, question.max_new_tokens, eos_token_id)
        self.reference = FullCacheReference(answer_ids, log_probs, self.answer.tokens)


def needle_fields(q: QuestionReference, plan: KeepPlan, rank: Callable[[], dict | None]) -> dict:
    """Needle recall of a compacted child's plan on one question (:mod:`bench.run.needles`); ``rank()`` gives the
    answer tokens' rank under the press's scores (None where the scores stay in the engine)."""
    if q.needle_positions is None:
        return {}
    sentence, answer = needle_recall(plan, q.needle_positions), needle_recall(plan, q.answer_tokens)
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

"""One context of a comparison: prefill once, score once per press, fork a child per (allocator, kept fraction),
answer every question from each child.

:class:`ContextRun` holds what every step of one context shares (the item, its questions' full-cache references,
the rows' common fields) and runs the protocol on the engine of the harness: :meth:`ContextRun.runtime` with this
project's runtime, :meth:`ContextRun.served` inside vLLM. Rows already in the store are skipped, so a killed run
resumes where it stopped.
"""

from __future__ import annotations

import time
from typing import Callable

from presses.selection import Selection
from runtime import KeepPlan, prefill
from runtime.batch import PaddedBatch

from .fidelity import answer_log_probs, log_probs_of
from .harness import Harness
from .needles import needle_rank
from .rows import QuestionReference, answered_row, base_row, method_fields, needle_fields
from .store import BASELINE, row_key

Method = tuple[str, str, float]
"""``(press label, allocator label, kept fraction)`` of one child."""


class ContextRun:
    """Every pending method of context ``index`` of ``task``.

    Parameters
    ----------
    harness : Harness
    task : str
    index : int
    is_done : Callable[[tuple], bool]
        Whether the store holds the row of a key (:func:`bench.store.row_key`).
    emit : Callable[[dict], None]
        Receives each new row.
    """

    def __init__(self, harness: Harness, task: str, index: int, is_done: Callable[[tuple], bool],
                 emit: Callable[[dict], None]):
        self.h, self.is_done, self.emit = harness, is_done, emit
        self.item = harness.item(task, index)
        self.rows, self.todo = [], []
        if self.item is None:
            return
        self.rows = [base_row(harness, task, self.item, q) for q in range(len(self.item.questions))]
        self.todo = [method for method in harness.settings.methods()
                     if any(not self._done(r, method) for r in self.rows)]

    def _done(self, row: dict, method: Method) -> bool:
        press, allocator, p = method
        return self.is_done(row_key({**row, "press": press, "allocator": allocator, "keep_fraction": p}))

    def run(self) -> int:
        """Answer every pending method; returns how many children it ran."""
        if self.todo:
            self.context = self.h.encode(self.item.context)
            self.protected = len(self.h.encode(self.item.protected_text))
            (self.runtime if self.h.engine is None else self.served)()
        return len(self.todo)

    def _common(self, prefill_seconds: float, n: int) -> dict:
        """What every row of the context records of it: the prefill's time, and its size in tokens (``protected``
        of them kept by every method) and in the attention entries a press chooses among (what ``kept_entries``
        counts)."""
        heads = len(self.h.adapter.attention_layers) * self.h.adapter.geometry.num_kv_heads
        return {"prefill_seconds": round(prefill_seconds, 4), "n_context": n, "protected": self.protected,
                "body_entries": (n - self.protected) * heads}

    def _references(self, parent) -> list[QuestionReference]:
        return [QuestionReference(question, parent, self.item.context, self.h.encode_list,
                                  self.h.tokenizer.eos_token_id) for question in self.item.questions]

    def _baseline(self, questions: list[QuestionReference], fields: dict) -> None:
        """The no-prune rows: the full cache's own answers and distributions (a keep-all child gives exactly
        these: ``tests/runtime/test_fork.py``), so nothing is decoded twice; their ΔNLL and KL are exactly 0."""
        for q, row in zip(questions, self.rows):
            if not self.is_done(row_key({**row, **fields})):
                self.emit(answered_row(self.item, q, row, fields, q.answer, q.reference.log_probs))

    def runtime(self) -> None:
        """The protocol with this project's runtime: the compacted children are answered ``settings.batch`` at a
        time as one padded batch (:mod:`runtime.batch`)."""
        h = self.h
        t0 = time.perf_counter()
        parent = prefill(h.model, self.context, protected=self.protected, evidence=h.evidence, tokenizer=h.tokenizer)
        common = self._common(time.perf_counter() - t0, parent.n)
        questions = self._references(parent)
        if self.todo[0][0] == BASELINE:
            self._baseline(questions, method_fields(BASELINE, BASELINE, 1.0, common, parent))
        selections = {name: Selection(parent, press, h.layer_weights) for name, press in h.presses.items()}
        ranks: dict[tuple, dict] = {}

        def answer_rank(selection: Selection, q: QuestionReference) -> dict:
            # the rank depends on the press and the question only: once for all of a press's children
            key = (id(selection), id(q))
            if key not in ranks:
                ranks[key] = needle_rank(selection.scores, q.answer_tokens, self.protected)
            return ranks[key]

        # similar kept fractions side by side: a batch is padded to its largest child
        compacted = sorted((method for method in self.todo if method[0] != BASELINE), key=lambda method: method[2])
        for start in range(0, len(compacted), h.settings.batch):
            children, methods, plans = [], [], []
            for press, allocator, p in compacted[start : start + h.settings.batch]:
                selection = selections[press]
                plan = selection.plan(h.allocators[allocator], p)
                children.append(parent.fork(plan))
                plans.append((plan, selection))
                methods.append(method_fields(press, allocator, p, common, children[-1], plan.total(),
                                             selection.score_seconds))
            self._answer_batch(questions, children, methods,
                               lambda i, q: needle_fields(q, plans[i][0], lambda: answer_rank(plans[i][1], q)))
            for child in children:
                child.release()
        parent.release()

    def _answer_batch(self, questions: list[QuestionReference], children: list, methods: list[dict],
                      needles: Callable[[int, QuestionReference], dict]) -> None:
        """Every pending question of every child, the children of a question answered as one batch;
        ``needles(i, q)`` gives child i's needle fields on question q."""
        eos = self.h.tokenizer.eos_token_id
        batch = None  # padded once, for every question
        for q, row in zip(questions, self.rows):
            members = [i for i, method in enumerate(methods) if not self.is_done(row_key({**row, **method}))]
            if not members:
                continue
            batch = batch or PaddedBatch(children)
            # one pass over the question feeds both the greedy answer and the teacher-forced reference answer
            answers, logits = batch.answer_and_follow(q.prompt_ids, q.reference.answer_ids, q.question.max_new_tokens,
                                                      eos, members)
            log_probs = log_probs_of(logits)
            for i, answer, child_log_probs in zip(members, answers, log_probs):
                self.emit(answered_row(self.item, q, row, methods[i], answer, child_log_probs, needles(i, q)))

    def served(self) -> None:
        """The same protocol inside vLLM (:mod:`serving`): the full cache is the context held uncompacted, with the
        evidence of every press (one prefill); each compacted child a copy of it, scored and compacted in the
        engine; references come from the engine."""
        from serving.cache import EngineCache

        h, engine, ids = self.h, self.h.engine, self.context.tolist()
        names = sorted({h.press_names[press] for press, _, _ in self.todo if press != BASELINE})
        parent = EngineCache(engine, engine.hold(ids, self.protected, names, h.settings.press_options), h.tokenizer)
        try:
            questions = self._references(parent)
            common = self._common(parent.held.prefill_seconds, parent.n)
            if self.todo[0][0] == BASELINE:
                self._baseline(questions, method_fields(BASELINE, BASELINE, 1.0, common, parent))
            for press, allocator, p in (method for method in self.todo if method[0] != BASELINE):
                held = engine.compact(parent.held, p, allocator=h.allocator_names[allocator],
                                      allocator_options=h.settings.alloc_options, press=h.press_names[press],
                                      press_options=h.settings.press_options)
                child = EngineCache(engine, held, h.tokenizer)
                try:
                    # the engine scores inside vLLM: the plan comes back, the scores do not (no rank)
                    plan = KeepPlan({int(layer): heads for layer, heads in child.held.plan.items()})
                    method = method_fields(press, allocator, p, common, child, plan.total(),
                                           child.held.score_seconds)
                    self._answer_alone(questions, child, method, lambda q: needle_fields(q, plan, lambda: None))
                finally:
                    child.release()
        finally:
            parent.release()

    def _answer_alone(self, questions: list[QuestionReference], child, method: dict,
                      needles: Callable[[QuestionReference], dict]) -> None:
        """Every pending question of one child, answered one at a time."""
        eos = self.h.tokenizer.eos_token_id
        for q, row in zip(questions, self.rows):
            if not self.is_done(row_key({**row, **method})):
                answer = child.answer(q.prompt_ids, q.question.max_new_tokens, eos)
                log_probs = answer_log_probs(child, q.prompt_ids, q.reference.answer_ids)
                self.emit(answered_row(self.item, q, row, method, answer, log_probs, needles(q)))

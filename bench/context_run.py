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
from runtime import Evidence, KeepPlan, prefill
from runtime.batch import DEFAULT_MEMORY_BUDGET, PaddedBatch, groups_within

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

    memory_budget = DEFAULT_MEMORY_BUDGET
    """Bytes one group of children may hold (:func:`runtime.batch.groups_within`)."""

    def __init__(self, harness: Harness, task: str, index: int, is_done: Callable[[tuple], bool],
                 emit: Callable[[dict], None]):
        self.h, self.is_done, self.emit = harness, is_done, emit
        self._ranks: dict[tuple[int, int], dict] = {}  # (press's selection, question) -> needle rank (:meth:`_rank`)
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
        """The protocol with this project's runtime: the compacted children are answered in groups, each one padded
        batch (:mod:`runtime.batch`) of at most ``settings.batch`` children within :attr:`memory_budget`, forked when
        the previous group has been answered and released."""
        h = self.h
        t0 = time.perf_counter()
        parent = prefill(h.model, self.context, protected=self.protected, evidence=h.evidence, tokenizer=h.tokenizer)
        common = self._common(time.perf_counter() - t0, parent.n)
        # similar kept fractions side by side: a batch is padded to its largest child
        compacted = sorted((method for method in self.todo if method[0] != BASELINE), key=lambda method: method[2])
        selections = {name: Selection(parent, press, h.layer_weights) for name, press in h.presses.items()}
        for name in {method[0] for method in compacted}:
            selections[name].scores  # noqa: B018 - scored now, so that the evidence can go before any child is made
        # what the presses read of the prefill (kvpress's presses: every attention layer's hidden states, 133 MiB
        # at 2,048 tokens on SmolLM2-135M) is not needed once every press has scored
        parent.evidence = Evidence()
        questions = self._references(parent)
        if self.todo[0][0] == BASELINE:
            self._baseline(questions, method_fields(BASELINE, BASELINE, 1.0, common, parent))
        # a question's pass is followed by its greedy answer, and apart by the reference answer teacher-forced
        forced = max(q.reference.answer_ids.numel() for q in questions)
        tokens = max(q.prompt_ids.numel() + max(q.question.max_new_tokens, forced) for q in questions)
        plans = ((method, selections[method[0]].plan(h.allocators[method[1]], method[2])) for method in compacted)
        for group in groups_within(parent, plans, tokens, forced, self.memory_budget, h.settings.batch):
            self._answer_group(questions, parent, selections, common, group)
        parent.release()

    def _rank(self, selection: Selection, q: QuestionReference) -> dict:
        """The answer tokens' rank under a press's scores: it depends on the press and the question only, so it is
        computed once for all of a press's children."""
        key = (id(selection), id(q))
        if key not in self._ranks:
            self._ranks[key] = needle_rank(selection.scores, q.answer_tokens, self.protected)
        return self._ranks[key]

    def _answer_group(self, questions: list[QuestionReference], parent, selections: dict[str, Selection],
                      common: dict, group: list[tuple[Method, KeepPlan]]) -> None:
        """Every pending question of the children of ``group``'s plans, the children of a question answered as one
        padded batch, each child forked into it and released at once (:meth:`PaddedBatch.forks`); the batch is
        released when this returns."""
        methods: list[dict] = []

        def fields(i: int, child) -> None:
            (press, allocator, p), plan = group[i]
            methods.append(method_fields(press, allocator, p, common, child, plan.total(),
                                         selections[press].score_seconds))

        def needles(i: int, q: QuestionReference) -> dict:
            (press, _, _), plan = group[i]
            return needle_fields(q, plan, lambda: self._rank(selections[press], q))

        batch = PaddedBatch.forks(parent, [plan for _, plan in group], fields)
        eos = self.h.tokenizer.eos_token_id
        for q, row in zip(questions, self.rows):
            members = [i for i, method in enumerate(methods) if not self.is_done(row_key({**row, **method}))]
            if not members:
                continue
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

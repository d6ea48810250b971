"""One context of a comparison: prefill once, score once per press, a child per (method, kept fraction), every
question answered from each child.

:class:`ContextRun` holds what every step of one context shares (the item, its questions' full-cache references,
the rows' common fields) and runs the protocol through the harness's :class:`~bench.run.engine.Engine`, whichever it
is. A context's rows are emitted together once all are made, its cache and the model are found as its presses
left them and every row is one the store's own checks take; rows already in the store are skipped, so a killed run
resumes where it stopped.
"""

from __future__ import annotations

import json
import math
from typing import Callable

import torch

from pretrained.model_fault import model_fault
from runtime import context_hash
from runtime.errors import UsageError
from runtime.user_code import UserCodeError, is_users

from ..store.legacy_rows import read_row
from ..store.row_fields import BASELINE_CODE, CONTEXT_SHA, METHOD_CODE, row_key
from ..store.row_set_checks import verify_rows
from .engine import Child, ChildGroup, HeldContext
from .harness import Harness
from .rows import QuestionReference, answered_row, base_row, batch_digest, method_fields, needle_fields
from .specs import BASELINE_METHOD


class ContextRun:
    """Every pending child of context ``index`` of ``task``.

    Parameters
    ----------
    harness : Harness
    task : str
    index : int
    is_done : Callable[[tuple], bool]
        Whether the store holds the row of a key (:func:`bench.store.row_fields.row_key`).
    emit : Callable[[dict], None]
        Receives each new row, once every row of the context is made and checked.
    """

    def __init__(self, harness: Harness, task: str, index: int, is_done: Callable[[tuple], bool],
                 emit: Callable[[dict], None]):
        self.h, self.is_done, self.emit = harness, is_done, emit
        self.item = harness.item(task, index)
        self.rows, self.todo = [], []
        self.made: list[dict] = []  # the new rows, emitted once the context is checked
        if self.item is None:
            return
        self.rows = [base_row(harness.run, harness.identity, task, self.item, q)
                     for q in range(len(self.item.questions))]
        self.todo = [child for child in harness.run.children if any(not self._done(r, child) for r in self.rows)]

    def _done(self, row: dict, child: Child) -> bool:
        method, p = child
        return self.is_done(row_key({**row, "press": method.press.label, "allocator": method.allocator.label,
                                     "keep_fraction": p, METHOD_CODE: self.h.run.method_codes[method.label]}))

    def run(self) -> int:
        """Answer every pending child; returns how many it ran."""
        if not self.todo:
            return 0
        h = self.h
        self.protected = len(h.encode(self.item.protected_text))
        compacted = [child for child in self.todo if not child[0].is_baseline]
        presses = list(dict.fromkeys(method.press for method, _ in compacted))
        ids = h.encode(self.item.context)
        parent = h.engine.prefill(ids, self.protected, presses)
        try:
            common = {**self._common(parent), CONTEXT_SHA: context_hash(torch.as_tensor(ids))[:16]}
            questions = [QuestionReference(question, parent, self.item.context, h.encode_list,
                                           h.tokenizer.eos_token_id) for question in self.item.questions]
            if self.todo[0][0].is_baseline:
                self._baseline(questions, method_fields(BASELINE_METHOD, BASELINE_CODE, 1.0, common,
                                                        parent.kv_nbytes, parent.recurrent_nbytes))
            if compacted:
                for group in parent.groups(compacted, questions):
                    try:
                        self._answer(questions, common, group)
                    finally:
                        group.release()
            # every row of the context is made from its cache and the model: both as its presses left them, or none
            # is written (probe 13: a press's thread, hooks or a weight changed through .data corrupted every row)
            parent.check_kept()
            h.check_model(parent.scored_by)
        finally:
            parent.release()
        self._check_rows()
        for row in self.made:
            self.emit(row)
        return len(self.todo)

    def _check_rows(self) -> None:
        """Refuse the context's new rows where the store's own checks (:func:`verify_rows`: each row, and each child
        against its no-prune row) would refuse one as read back: appended, it would block every later command on the
        store (probe 14: a press's scores keyed ``3.0`` gave rows keyed ``'3.0'``). None of the context's rows is
        written; a :class:`UserCodeError` where the row's press or allocator is a user's, else the bench's own bug."""
        # as the store reads it: JSON's keys are text; read_row gives None only for a row lacking names, which
        # row_problem then names as missing
        stored = [read_row(json.loads(json.dumps(row))) or row for row in self.made]
        for row in stored:  # the full cache's own numbers: no method's, and no bug of the bench's (probe 27, #3)
            shown = [f"{key}={value!r}" for key, value in row.items()
                     if isinstance(value, float) and not math.isfinite(value)]
            if shown and (row.get("press"), row.get("allocator")) == (BASELINE_METHOD.press.label,
                                                                      BASELINE_METHOD.allocator.label):
                raise UsageError(model_fault(f"NaN or infinite log-probabilities on its own full cache ({shown[0]} "
                                             f"on {row.get('task')} item {row.get('item')})", self.h.model_dir,
                                             self.h.adapter.dtype) + "; none of the context's rows was written")
        named = [f"the context's row {index + 1}" for index in range(len(stored))]  # as one problem names another
        problems = verify_rows(stored, named.__getitem__)
        if not problems:
            return
        index = next(index for index, name in enumerate(named) if problems[0].startswith(f"{name}: "))
        row, problem = stored[index], problems[0].removeprefix(f"{named[index]}: ")
        method = next((method for method, _ in self.h.run.children if not method.is_baseline
                       and (method.press.label, method.allocator.label) == (row.get("press"), row.get("allocator"))),
                      None)
        made_by = "the no-prune method" if method is None else (
            f"press {row['press']} with allocator {row['allocator']} at keep fraction {row.get('keep_fraction')}")
        message = (f"{made_by} made a row of {row.get('task')} item {row.get('item')} that the store would refuse: "
                   f"{problem}; none of the context's rows was written")
        if method is not None and (is_users(type(self.h.presses[method.press]))
                                   or is_users(type(self.h.allocators[method.allocator]))):
            raise UserCodeError(message)
        raise RuntimeError(f"{message} (a bug of the bench: its own code made the row)")

    def _common(self, parent: HeldContext) -> dict:
        """What every row of the context records of it: the prefill's time, and its size in tokens (``protected``
        of them kept by every method) and in the attention entries a press chooses among (what ``kept_entries``
        counts)."""
        heads = len(self.h.adapter.attention_layers) * self.h.adapter.geometry.num_kv_heads
        return {"prefill_seconds": round(parent.prefill_seconds, 4), "n_context": parent.n,
                "protected": self.protected, "body_entries": (parent.n - self.protected) * heads}

    def _baseline(self, questions: list[QuestionReference], fields: dict) -> None:
        """The no-prune rows: the full cache's own answers and distributions (a keep-all child gives exactly
        these: ``tests/runtime/test_fork.py``), so nothing is decoded twice; their ΔNLL and KL are exactly 0."""
        for q, row in zip(questions, self.rows):
            if not self.is_done(row_key({**row, **fields})):
                self.made.append(answered_row(self.item, q, row, fields, q.answer, q.reference.log_probs))

    def _answer(self, questions: list[QuestionReference], common: dict, group: ChildGroup) -> None:
        """Every pending question of the children of ``group``, the pending children of a question answered
        together."""
        codes = self.h.run.method_codes
        methods = [method_fields(c.child[0], codes[c.child[0].label], c.child[1], common, c.kv_bytes,
                                 c.recurrent_bytes, c.plan.total(), c.score_seconds) for c in group.members]
        for q, row in zip(questions, self.rows):
            which = [i for i, method in enumerate(methods) if not self.is_done(row_key({**row, **method}))]
            if not which:
                continue
            answers, log_probs = group.answer(q, which)
            batch = batch_digest(methods, [methods[i] for i in which])
            for i, answer, child_log_probs in zip(which, answers, log_probs):
                c = group.members[i]
                needles = needle_fields(q, c.plan, lambda c=c: c.rank(q))
                self.made.append(answered_row(self.item, q, row, {**methods[i], **batch}, answer, child_log_probs,
                                              needles))

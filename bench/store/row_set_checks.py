"""Whether rows agree with one another, and :func:`verify_rows`, every check of a set of rows: a child's ΔNLL its NLL
minus the no-prune row's of its question, its context's sizes the no-prune row's, its attention cache no larger than
the full cache and its agreement with the full cache's answer borne out by its prediction; one schema per model and
code, the same needle fields in every child of a task, one per-layer layout per model. Each row alone is checked
first (:mod:`bench.store.row_checks`)."""

from __future__ import annotations

import reprlib

from .row_checks import layer_layout, layout_text, row_problem
from .row_fields import (
    BASELINE,
    KEY_FIELDS,
    PER_LAYER_FRACTION_FIELDS,
)

DELTA_NLL_TOLERANCE = 1e-6
"""How far a child's ΔNLL may be from its NLL minus the no-prune row's, relative to the larger NLL (at least 1 nat).
Both NLLs are float32 sums and ΔNLL their float64 difference, the no-prune row's NLL the very one subtracted: a run
writes it exactly. This allows some 8 float32 ulps of the larger NLL: a full-cache NLL summed in another order."""


CHILD_FIELDS = ("press", "allocator", "keep_fraction", "method_code")
"""The key fields that tell apart the children of one question of one context (the no-prune row one of them): its
method (with its own code) and kept fraction."""


CONTEXT_FIELDS = ("n_context", "protected", "body_entries", "recurrent_bytes", "context_sha")
"""What a child records of its context as the no-prune row of its question does: the context's size, what every
method keeps, the entries chosen among, the recurrent state (copied into every child whole) and its text's digest
(:data:`~bench.store.row_fields.CONTEXT_SHA`)."""


MODEL_FIELDS = ("model", "weights", "artifacts")
"""The key fields that name the model a row ran: a child and its no-prune row name one model alike."""
RENAMED_FIELDS = (*MODEL_FIELDS, "length")
"""The key fields a hand edit may change in a child, or in its no-prune row, so that they no longer meet: its model,
and the length its context was fitted to (probe 12: a no-prune row's length edited made a group of its own)."""


def question_of(row: dict, but: tuple = ()) -> tuple:
    """The key of ``row`` but the child's (:data:`CHILD_FIELDS`) and ``but``: one question of one context of one
    run."""
    return tuple(row.get(field) for field in KEY_FIELDS if field not in CHILD_FIELDS + but)


def _model_problem(row: dict, fulls: list[int], rows: list[dict], where) -> str | None:
    """What is wrong with a valid child ``row`` that has no no-prune row of its question, but whose ``delta_nll``
    was measured against one of ``fulls`` (the valid no-prune rows of its question but its model and length,
    :data:`RENAMED_FIELDS`): its model field or length other than that row's. A child and its full cache run one
    model on one context, so such a row, or that no-prune row, was changed after it was written (probe 8, item 6: a
    child renamed smollm2-135m-instruct passed and made a leaderboard section of its own, its ΔNLL the hybrid's;
    probe 12: a no-prune row's length edited). Another model's children alone, measured against their own model,
    match no such row: their ΔNLL is no difference of these NLLs."""
    for full in fulls:
        nll, full_nll = row["answer_nll"], rows[full]["answer_nll"]
        if abs(row["delta_nll"] - (nll - full_nll)) <= DELTA_NLL_TOLERANCE * max(1.0, abs(nll), abs(full_nll)):
            field = next(field for field in RENAMED_FIELDS if row.get(field) != rows[full].get(field))
            one = "answer one context, fitted to one length" if field == "length" else "run one model"
            return (f"{field}={row.get(field)!r}, where the no-prune row its delta_nll was measured against "
                    f"({where(full)}) holds {rows[full].get(field)!r} (expected the same: a child and its full "
                    f"cache {one})")
    return None


def _child_problem(row: dict, full: dict, there: str) -> str | None:
    """What is wrong with a valid child ``row`` beside the valid no-prune row ``full`` of its question (at
    ``there``): its ``delta_nll`` not its ``answer_nll`` minus the full cache's (within
    :data:`DELTA_NLL_TOLERANCE`), its context's sizes (:data:`CONTEXT_FIELDS`) other than the full cache's, its
    ``kv_bytes`` more than the full cache's (a child keeps some of its entries),
    or ``agree`` true (the same greedy tokens as the full cache) with a prediction other than the full cache's (the
    same tokens decode to the same text), or ``answers`` other than the full cache's (one question, one reference).
    ``agree`` false with the same prediction is no problem: two token sequences may decode to one text."""
    nll, full_nll = row["answer_nll"], full["answer_nll"]
    tolerance = DELTA_NLL_TOLERANCE * max(1.0, abs(nll), abs(full_nll))
    if abs(row["delta_nll"] - (nll - full_nll)) > tolerance:
        return (f"delta_nll={row['delta_nll']!r} (expected answer_nll {nll!r} minus the no-prune row's answer_nll "
                f"{full_nll!r} ({there}) = {nll - full_nll!r}, within {tolerance:.3g})")
    differs = next((field for field in CONTEXT_FIELDS if row.get(field) != full.get(field)), None)
    if differs is not None:
        return (f"{differs}={row.get(differs)!r} (expected the no-prune row's {full.get(differs)!r} ({there}): the "
                "children of one question share its context)")
    kv_bytes, full_kv_bytes = row.get("kv_bytes"), full.get("kv_bytes")
    if kv_bytes is not None and full_kv_bytes is not None and kv_bytes > full_kv_bytes:
        return (f"kv_bytes={kv_bytes} (expected at most the no-prune row's {full_kv_bytes} ({there}): a child keeps "
                "some of the full cache's entries)")
    if row.get("answers") != full.get("answers"):
        return (f"answers={reprlib.repr(row.get('answers'))} (expected the no-prune row's "
                f"{reprlib.repr(full.get('answers'))} ({there}): the children of one question answer the same one)")
    if row["agree"] and row.get("prediction") != full.get("prediction"):
        return (f"agree=True with prediction {reprlib.repr(row.get('prediction'))}, not the no-prune row's "
                f"{reprlib.repr(full.get('prediction'))} ({there}) (expected false: the full cache's greedy answer "
                "decodes to its prediction)")
    return None


def measured_problems(rows: list[dict], valid: list[bool], where, skipped=()) -> dict[int, str]:
    """By index, the valid rows (but ``skipped``) that do not match the valid no-prune row of their question among
    ``rows`` (:func:`_child_problem`). A question without one, whose no-prune row is in another store (a method's
    store of a collection beside its group's ``none``), is not checked against it here, but a child measured against
    another model's is named (:func:`_model_problem`); a child whose no-prune row no store holds is refused as
    incomplete (:mod:`bench.store.completeness`)."""
    baselines: dict[tuple, int] = {}
    of_any_model: dict[tuple, list[int]] = {}
    for index, row in enumerate(rows):
        if valid[index] and row["press"] == BASELINE:
            baselines.setdefault(question_of(row), index)
            of_any_model.setdefault(question_of(row, RENAMED_FIELDS), []).append(index)
    problems = {}
    for index, row in enumerate(rows):
        if index in skipped:
            continue
        full = baselines.get(question_of(row)) if valid[index] else None
        if full is not None and index != full and (problem := _child_problem(row, rows[full], where(full))):
            problems[index] = problem
        elif full is None and valid[index] and row["press"] != BASELINE and (problem := _model_problem(
                row, of_any_model.get(question_of(row, RENAMED_FIELDS), []), rows, where)):
            problems[index] = problem
    return problems


def _child_problems(rows: list[dict], valid: list[bool], where) -> dict[int, str]:
    """By index, the valid rows that do not match the others: a schema other than the other rows' of its model and
    code; a child with needle fields where another child of its task, model and code has none (or the reverse), or
    with per-layer values of another layout than the model's other rows; a child that does not match the valid
    no-prune row of its question (:func:`measured_problems`)."""
    problems = {}
    layouts: dict[tuple, tuple[int, str, dict]] = {}
    needled: dict[tuple, tuple[int, bool]] = {}
    schemas: dict[tuple, tuple[int, int]] = {}
    for index, row in enumerate(rows):
        if not valid[index]:
            continue
        code = (row["model"], row["weights"], row.get("code"))
        schema = schemas.setdefault(code, (index, row.get("schema")))
        if schema[1] != row.get("schema"):
            problems[index] = (f"schema={row.get('schema')!r}, where the row at {where(schema[0])} of the same model, "
                               f"weights and code holds {schema[1]!r} (expected one: one code writes one schema)")
            continue
        if row["press"] == BASELINE:
            continue
        field = next((f for f in PER_LAYER_FRACTION_FIELDS if row.get(f) is not None), None)
        first = needled.setdefault((*code, row["task"], row["haystack"]), (index, field is not None))
        if first[1] != (field is not None):
            fields = ", ".join(PER_LAYER_FRACTION_FIELDS)
            problems[index] = (f"{'no' if field is None else 'a'} needle recall ({fields}), where the child at "
                               f"{where(first[0])} of the same task, model and code has "
                               f"{'one' if first[1] else 'none'} (expected the same fields in every child of a task)")
            continue
        if field is not None:
            layout = layer_layout(row[field])
            seen = layouts.setdefault((row["model"], row["weights"]), (index, field, layout))
            if seen[2] != layout:
                problems[index] = (f"{field} holds layers and heads {layout_text(layout)}, where the row at "
                                   f"{where(seen[0])} of the same model and weights holds {layout_text(seen[2])} in "
                                   f"{seen[1]} (expected one value per attention layer and KV head of the model)")
    problems.update(measured_problems(rows, valid, where, skipped=set(problems)))
    return problems


def verify_rows(rows: list[dict], where=None) -> list[str]:
    """What is wrong with ``rows`` (empty if nothing), in their order, each problem prefixed by ``where(index)``
    (default ``row N``): each row's own (:func:`row_problem`), and a valid child's against the no-prune row of its
    question (:func:`_child_problems`)."""
    where = where or (lambda index: f"row {index + 1}")
    problems = {index: problem for index, row in enumerate(rows) if (problem := row_problem(row))}
    problems.update(_child_problems(rows, [index not in problems for index in range(len(rows))], where))
    return [f"{where(index)}: {problems[index]}" for index in sorted(problems)]

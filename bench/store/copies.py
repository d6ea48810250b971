"""One key, one value: the copies of a row that several stores hold agree, or differ only as two padded batches make
them differ (their fidelity values, within the tolerance of the dtype they ran in)."""

from __future__ import annotations

import reprlib

from runtime.errors import UsageError

from .result_store import ResultStore
from .row_fields import (
    BATCH,
    CARRIED_FROM,
    FIDELITY_FIELDS,
    RUN,
    describe_row,
    row_key,
)

BATCH_TOLERANCE = {"float32": 1e-4, "bfloat16": 0.05, "float16": 0.01}
"""How far the fidelity values (answer_nll, delta_nll, kl) of one row answered in two padded batches may differ,
relative to the larger of 1 and their magnitudes, by the dtype the rows ran in: other shapes sum in another order
(measured in float32: 2e-6 nats at most). Every other value — the prediction, the score, what was kept — is the
same from any batch."""


def row_values(row: dict) -> dict:
    # the timings of one context are measured where it ran, the run that wrote it is where the row comes from, the
    # batch that answered it is how it was computed, and the code it was carried from (bench carry) is its history:
    # not values of it, so two copies of a row may differ in them alone
    return {k: v for k, v in row.items() if not k.endswith("_seconds") and k not in (RUN, BATCH, CARRIED_FROM)}


def batch_difference(a: dict, b: dict) -> float | None:
    """The largest difference of the fidelity values of two copies of one row answered in other padded batches
    (:data:`~bench.store.row_fields.BATCH`), where that is all they differ in (:data:`BATCH_TOLERANCE`); None otherwise
    — also for rows that do not record their batch, which could have come from one."""
    if a.get(BATCH) is None or b.get(BATCH) is None or a[BATCH] == b[BATCH]:
        return None
    va, vb = row_values(a), row_values(b)
    if {k: v for k, v in va.items() if k not in FIDELITY_FIELDS} != {
            k: v for k, v in vb.items() if k not in FIDELITY_FIELDS}:
        return None
    tolerance = BATCH_TOLERANCE.get(a.get("dtype"), BATCH_TOLERANCE["float32"])
    largest = 0.0
    for field in FIDELITY_FIELDS:
        x, y = va.get(field), vb.get(field)
        if isinstance(x, bool) or isinstance(y, bool) or not (
                isinstance(x, (int, float)) and isinstance(y, (int, float))):
            if x != y:
                return None
            continue
        if abs(x - y) > tolerance * max(1.0, abs(x), abs(y)):
            return None
        largest = max(largest, abs(x - y))
    return largest


def _first_difference(a: dict, b: dict) -> str:
    """The first field two copies of a row hold other values of, as a message shows it."""
    va, vb = row_values(a), row_values(b)
    field = next(k for k in sorted(set(va) | set(vb)) if va.get(k) != vb.get(k))
    return f"{field} {reprlib.repr(va.get(field))} and {reprlib.repr(vb.get(field))}"


def check_one_value(stores: list[ResultStore], copies: bool = False) -> list[float]:
    """``UsageError`` naming (by file and line) the first row key that two rows of ``stores`` hold with other values:
    one key, one value. With ``copies`` False, also a key held twice with the same values, which a report would
    count twice. ``bench merge`` passes True: it keeps the first copy of a key, and two copies may also differ where
    each was answered in another padded batch, in their fidelity values alone and within :data:`BATCH_TOLERANCE`
    (a method held by two runs of other methods); returns the largest difference of each such key."""
    seen: dict[tuple, tuple[dict, str]] = {}
    differences = []
    for store in stores:
        for row, line in zip(store.rows, store.line_numbers):
            key, where = row_key(row), f"{store.path}:{line}"
            if key not in seen:
                seen[key] = (row, where)
                continue
            first, there = seen[key]
            same = row_values(first) == row_values(row)
            difference = None if same else batch_difference(first, row)
            if not same and difference is None:
                batches = " (from two padded batches, which change only the last digits of NLL and KL)" if (
                    first.get(BATCH) is not None and row.get(BATCH) is not None
                    and first[BATCH] != row[BATCH]) else ""
                raise UsageError(f"{there} and {where} hold the row of {describe_row(row)} with other values "
                                 f"({_first_difference(first, row)}){batches}: one key, one value (shards of one run "
                                 "agree on every row they share)")
            if not copies:
                raise UsageError(f"{there} and {where} both hold the row of {describe_row(row)}: a report would count "
                                 "it twice; keep one copy (bench merge joins stores, keeping one)")
            if difference is not None:
                differences.append(difference)
    return differences

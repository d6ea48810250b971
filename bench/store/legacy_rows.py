"""Rows written before some of today's fields existed, read as rows of today.

A field added to the rows leaves the rows already written (every committed store) without it: they are read with
what they ran with, under today's names, and never rewritten. A field renamed is read under its new name. A field
that no default stands for — the run a row names (:data:`bench.store.row_fields.RUN`), how many questions its context
has (:data:`bench.store.row_fields.QUESTIONS`) — stays absent, and readers check such rows as before it existed.
"""

from __future__ import annotations

LEGACY_DEFAULTS = {"engine": "hf", "dtype": "float32", "device": "cpu", "haystack": "generated"}
"""What rows written before these fields existed ran with: the HF runtime (the only engine), float32 on CPU (the
only settings of the runs the committed store holds), on the generated haystacks (the only ones then)."""
LEGACY_NAMES = {"keep_fraction": "ratio", "recurrent_bytes": "gdn_bytes"}
"""Fields that rows written before were stored under another name; they are read under the new one: the kept
fraction p was ``ratio`` (a word that elsewhere names the evicted fraction 1 − p), the recurrent state's bytes were
``gdn_bytes`` (Mamba2 layers' state too)."""
OPTIONAL_FIELDS = ("artifacts", "method_code")
"""Key fields that rows written before them lack: their ``weights`` fingerprint covered the artifacts too, and their
``code`` hashed all the code a row ran, its method's own included (:data:`bench.store.row_fields.METHOD_CODE`)."""


ROW_NAMES = ("model", "press", "allocator", "task", "item")
"""What every row names, under today's name and before."""


def not_a_row(value) -> str:
    """Why ``value`` (one parsed line of a store, None where it is no JSON) is no row, as a refusal says it."""
    if not isinstance(value, dict):
        return "not a row (not a JSON object of a row's fields; restore the line from the run's store)"
    lacks = [f for f in ROW_NAMES if f not in value] + (
        [] if "keep_fraction" in value or LEGACY_NAMES["keep_fraction"] in value else ["keep_fraction"])
    return f"not a row: it lacks {', '.join(lacks)} (restore the line from the run's store)"


def read_row(value) -> dict | None:
    """``value`` (one parsed line of a store) as a row of today's fields, or None if it is not a row: a row names
    its model, press, allocator, task, item and kept fraction (under its name of today or of before)."""
    if not (isinstance(value, dict) and all(f in value for f in ROW_NAMES) and (
            "keep_fraction" in value or LEGACY_NAMES["keep_fraction"] in value)):
        return None
    for field, legacy in LEGACY_NAMES.items():
        if legacy in value:
            value[field] = value.pop(legacy)
    for field, default in LEGACY_DEFAULTS.items():
        value.setdefault(field, default)
    return value

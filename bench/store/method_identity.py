"""One method, one code: a setting group holds the rows of each method under one method code.

A row names its method's own code (:data:`~bench.store.row_fields.METHOD_CODE`) beside the code its whole group shares.
A press edited after its rows were written (a user's own, or the project's) computes other values under the same
label: its new rows are another result. A store never pools the two: a run refuses to add them beside the old ones
(:func:`check_run_method_codes`), and ``bench verify`` and every report refuse a group that holds both
(:func:`check_one_method_code`).
"""

from __future__ import annotations

from collections.abc import Iterable

from runtime.errors import UsageError

from .row_fields import GROUP_FIELDS, METHOD_CODE, method_of


def _codes(rows: Iterable[dict], where) -> dict[tuple, dict[str | None, object]]:
    """``{(group, method): {method code: where its first row is}}`` of ``rows``."""
    held: dict[tuple, dict[str | None, object]] = {}
    for index, row in enumerate(rows):
        group = tuple(str(row.get(field)) for field in GROUP_FIELDS)
        held.setdefault((group, method_of(row)), {}).setdefault(row.get(METHOD_CODE), where(index))
    return held


def check_one_method_code(rows: list[dict], where) -> None:
    """``UsageError`` naming the first method of ``rows`` whose rows of one setting group carry two method codes;
    ``where(index)`` names a row (its file and line)."""
    for (_, method), codes in _codes(rows, where).items():
        if len(codes) > 1:
            (first, at), (second, other) = list(codes.items())[:2]
            raise UsageError(f"{at} and {other}: rows of {method} in one setting group computed by two versions of "
                             f"its own code (method code {first} and {second}): they are two results. Keep each in a "
                             "store of its own (or remove the rows of the version you no longer want)")


def check_run_method_codes(group: dict, method_codes: dict[str, str], rows: list[dict], store_path) -> None:
    """``UsageError`` before a run adds rows of a method whose rows in the store (of the run's setting ``group``)
    were computed by another version of its own code (``method_codes``: the run's, by method label)."""
    for row in rows:
        if all(row.get(k) == v for k, v in group.items()):
            mine = method_codes.get(method_of(row))
            if mine is not None and row.get(METHOD_CODE) != mine:
                raise UsageError(f"{store_path} holds rows of {method_of(row)} in this setting group computed by "
                                 f"another version of its own code (method code {row.get(METHOD_CODE)}; this "
                                 f"checkout's is {mine}): its press or allocator changed since, and the new rows "
                                 "would be another result under the same name. Write to another --out (or remove "
                                 "its old rows there first)")

"""Whether a row is a valid result: each value of its type and range, the context's counts within its size, the row
a context of its run's shard, a no-prune row exactly at zero ΔNLL and KL, and a child's ΔNLL its NLL minus the
no-prune row's.

Every reader checks rows before it reports on them (``bench verify``, reports, ``bench merge``), so that no report
shows a value no run could have written.
"""

from __future__ import annotations

import math
import reprlib

from workloads.tasks.registry import haystack_of

from .legacy_rows import OPTIONAL_FIELDS
from .row_fields import (
    BASELINE,
    FIDELITY_FIELDS,
    FRACTION_FIELDS,
    KEY_FIELDS,
    PER_LAYER_FRACTION_FIELDS,
    RUN,
    RUN_FIELDS,
)

KL_TOLERANCE = 1e-6
"""KL below 0 by at most this much is float rounding of a child almost equal to the full cache."""
DELTA_NLL_TOLERANCE = 1e-6
"""How far a child's ΔNLL may be from its NLL minus the no-prune row's, relative to the larger NLL (at least 1 nat).
Both NLLs are float32 sums and ΔNLL their float64 difference, the no-prune row's NLL the very one subtracted: a run
writes it exactly. This allows some 8 float32 ulps of the larger NLL: a full-cache NLL summed in another order."""
CHILD_FIELDS = ("press", "allocator", "keep_fraction")
"""The key fields that tell apart the children of one question of one context (the no-prune row one of them)."""
SECONDS = "_seconds"
"""The ending of the fields that hold a time in seconds (``prefill_seconds``, ``score_seconds``)."""


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value) -> bool:
    return _integer(value) and value >= 0


def _count_problem(row: dict) -> str | None:
    """The context's and the child's sizes, where a row records them: ``n_context`` tokens, ``protected`` of them
    kept by every method, ``body_entries`` attention entries a press chooses among, the ``kept_entries`` of a
    compacted child (at most all of them), and the child's ``kv_bytes`` of attention cache and ``recurrent_bytes`` of
    recurrent state."""
    bounds = [("n_context", None), ("protected", "n_context"), ("body_entries", None), ("kept_entries", "body_entries"),
              ("kv_bytes", None), ("recurrent_bytes", None)]
    for field, bound in bounds:
        value, limit = row.get(field), row.get(bound) if bound else None
        if value is None:
            continue
        if not _count(value) or (_count(limit) and value > limit):
            within = f" at most {bound} = {limit}" if _count(limit) else ""
            return f"{field}={value!r} (expected an integer >= 0{within})"
    return None


def _fraction(value) -> bool:
    return _number(value) and 0 <= value <= 1


def _per_layer_problem(row: dict) -> str | None:
    """The first value of a :data:`PER_LAYER_FRACTION_FIELDS` field that is not a fraction, or its wrong shape."""
    for field in PER_LAYER_FRACTION_FIELDS:
        layers = row.get(field)
        if layers is None:
            continue
        if not isinstance(layers, dict) or not all(isinstance(heads, list) for heads in layers.values()):
            return f"{field}={reprlib.repr(layers)} (expected {{layer: [a number in [0, 1] per head]}})"
        for layer, heads in layers.items():
            for head, value in enumerate(heads):
                if not _fraction(value):
                    return f"{field}[{layer!r}][{head}]={value!r} (expected a number in [0, 1])"
    return None


def _run_problem(row: dict) -> str | None:
    """What is wrong with the run a row names (:data:`RUN`), or None (also for a row written before runs were
    recorded): its fields of their types, and the row's context one its shard took."""
    run = row.get(RUN)
    if run is None:
        return None
    if not (isinstance(run, dict) and set(run) == set(RUN_FIELDS) and isinstance(run["tasks"], list) and run["tasks"]
            and all(isinstance(task, str) for task in run["tasks"]) and len(set(run["tasks"])) == len(run["tasks"])
            and _count(run["n"]) and run["n"] >= 1 and _count(run["shard"]) and _count(run["shards"])
            and run["shard"] < run["shards"] and isinstance(run["haystack"], str)):
        return (f"{RUN}={reprlib.repr(run)} (expected {{'tasks': [task names, each once], 'n': items per task >= 1, "
                "'haystack': name, 'shard': k, 'shards': N > k}})")
    task, item = row["task"], row["item"]
    if task not in run["tasks"] or not _count(item) or item >= run["n"] or row["haystack"] != haystack_of(
            task, run["haystack"]):
        return (f"task {task}, item {item!r} (haystack {row['haystack']}) is not a context of its run (items 0 … "
                f"{run['n'] - 1} of {', '.join(run['tasks'])}, haystack {run['haystack']})")
    position, k, count = run["tasks"].index(task) * run["n"] + item, run["shard"], run["shards"]
    if position % count != k:
        return (f"task {task}, item {item} (position {position} of its run) is not a context of shard {k}/{count} "
                f"(positions {k}, {k + count}, …)")
    return None


def row_problem(row: dict) -> str | None:
    """What is wrong with one row, or None: every key and fidelity field present; its length an integer >= 1, its
    item and question integers >= 0, its seed an integer; every fraction (:data:`FRACTION_FIELDS`,
    :data:`PER_LAYER_FRACTION_FIELDS`) in [0, 1]; keep_fraction in (0, 1]; answer_nll (a negative log-likelihood) and
    kl finite numbers >= 0, delta_nll a finite number; agree a boolean; every time (``*_seconds``) a finite number >= 0;
    the context's counts within its size and the child's bytes integers >= 0 (:func:`_count_problem`); its context
    one of its run's shard (:func:`_run_problem`); and a no-prune row — the full cache compared with itself — at
    exactly zero ΔNLL and KL, agreeing."""
    missing = [f for f in (*KEY_FIELDS, "score", *FIDELITY_FIELDS) if row.get(f) is None and f not in OPTIONAL_FIELDS]
    if missing:
        return f"missing {', '.join(missing)}"
    seconds = [field for field in row if field.endswith(SECONDS)]
    checks = [("length", lambda v: _integer(v) and v >= 1, "an integer >= 1"),
              *((field, _count, "an integer >= 0") for field in ("item", "question")),
              ("seed", _integer, "an integer"),
              *((field, lambda v: v is None or _fraction(v), "a number in [0, 1]") for field in FRACTION_FIELDS),
              ("keep_fraction", lambda v: _number(v) and 0 < v <= 1, "a number in (0, 1]"),
              ("answer_nll", lambda v: _number(v) and v >= 0, "a finite number >= 0"),
              ("delta_nll", _number, "a finite number"),
              ("kl", lambda v: _number(v) and v >= -KL_TOLERANCE, "a finite number >= 0"),
              ("agree", lambda v: isinstance(v, bool), "true or false"),
              *((field, lambda v: v is None or (_number(v) and v >= 0), "a finite number >= 0") for field in seconds)]
    for field, valid, allowed in checks:
        if not valid(row.get(field)):
            return f"{field}={row.get(field)!r} (expected {allowed})"
    problem = _per_layer_problem(row) or _count_problem(row) or _run_problem(row)
    if problem:
        return problem
    if row["press"] == BASELINE and (row["delta_nll"] != 0 or row["kl"] != 0 or row["agree"] is not True):
        return (f"the no-prune row has delta_nll={row['delta_nll']}, kl={row['kl']}, agree={row['agree']} "
                "(expected exactly 0, 0, true)")
    return None


def _question_of(row: dict) -> tuple:
    """The key of ``row`` but the child's (:data:`CHILD_FIELDS`): one question of one context of one run."""
    return tuple(row.get(field) for field in KEY_FIELDS if field not in CHILD_FIELDS)


def _delta_problems(rows: list[dict], valid: list[bool], where) -> dict[int, str]:
    """By index, the valid rows whose ``delta_nll`` is not their ``answer_nll`` minus that of the no-prune row of
    their question (within :data:`DELTA_NLL_TOLERANCE`). A question without a no-prune row among ``rows`` (a run of
    compacted children alone) is not checked."""
    baselines: dict[tuple, int] = {}
    for index, row in enumerate(rows):
        if valid[index] and row["press"] == BASELINE:
            baselines.setdefault(_question_of(row), index)
    problems = {}
    for index, row in enumerate(rows):
        full = baselines.get(_question_of(row)) if valid[index] else None
        if full is None or index == full:
            continue
        nll, full_nll = row["answer_nll"], rows[full]["answer_nll"]
        tolerance = DELTA_NLL_TOLERANCE * max(1.0, abs(nll), abs(full_nll))
        if abs(row["delta_nll"] - (nll - full_nll)) > tolerance:
            problems[index] = (f"delta_nll={row['delta_nll']!r} (expected answer_nll {nll!r} minus the no-prune row's "
                               f"answer_nll {full_nll!r} ({where(full)}) = {nll - full_nll!r}, within {tolerance:.3g})")
    return problems


def verify_rows(rows: list[dict], where=None) -> list[str]:
    """What is wrong with ``rows`` (empty if nothing), in their order, each problem prefixed by ``where(index)``
    (default ``row N``): each row's own (:func:`row_problem`), and a valid child's ΔNLL against the no-prune row of
    its question (:func:`_delta_problems`)."""
    where = where or (lambda index: f"row {index + 1}")
    problems = {index: problem for index, row in enumerate(rows) if (problem := row_problem(row))}
    problems.update(_delta_problems(rows, [index not in problems for index in range(len(rows))], where))
    return [f"{where(index)}: {problems[index]}" for index in sorted(problems)]

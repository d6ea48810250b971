"""Whether one row, read alone, is a valid result: each value of its type and range, its score the task's metric of
its prediction, the context's counts within its size and a child's kept entries its allocator's budget, the row a
context of its run's shard, a no-prune row exactly at zero ΔNLL and KL. What a row must agree with among the others
(its question's no-prune row, its model's schema and layout) is :mod:`bench.store.row_set_checks`'.

Every reader checks rows before it reports on them (``bench verify``, reports, ``bench merge``), so that no report
shows a value no run could have written.
"""

from __future__ import annotations

import math
import re
import reprlib
import sys

from allocators.integerize import round_half_up
from pretrained.loading import DTYPES, fingerprint_of_parts
from workloads.metrics import METRICS
from workloads.tasks.registry import ALL_TASKS, haystack_of
from workloads.tasks.ruler import METRIC, PROFILES

from .context_fit import fit_problem
from .label_read_back import read_back_problem
from .legacy_rows import OPTIONAL_FIELDS
from .row_fields import (
    BASELINE,
    BATCH,
    CARRIED_FROM,
    CODE,
    ENGINES,
    FIDELITY_FIELDS,
    FRACTION_FIELDS,
    KEY_FIELDS,
    PER_LAYER_FRACTION_FIELDS,
    QUESTIONS,
    RUN,
    RUN_FIELDS,
    SCHEMA,
    mean_over_heads,
)

KL_TOLERANCE = 1e-6
"""KL below 0 by at most this much is float rounding of a child almost equal to the full cache."""
SECONDS_MAX = 1e9
"""The longest time a row may record, in seconds (some 31 years): any more is no timing of a run."""
MEAN_TOLERANCE = 1e-12
"""How far a recall may lie from the mean of its per-layer values: float rounding only (a row holds both as
written, one the mean of the other)."""
CHILD_ONLY = ("kept_entries", "needle_recall", "needle_recall_layers", "answer_recall", "answer_recall_layers",
              "answer_rank_layers", "score_seconds")
"""Fields of a compacted child that a no-prune row never holds: what was kept, and how long the press took."""
DEVICE = re.compile(r"cpu|cuda(:\d+)?")
"""The devices a run records (``--device`` cpu, cuda or cuda:N; auto is recorded as the one it chose)."""
SECONDS = "_seconds"
"""The ending of the fields that hold a time in seconds (``prefill_seconds``, ``score_seconds``)."""


def _number(value) -> bool:
    # JSON integers are unbounded: one of more than 308 digits is no float, and math.isfinite would raise on it
    if _integer(value):
        return abs(value) <= sys.float_info.max
    return isinstance(value, float) and math.isfinite(value)


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value) -> bool:
    return _integer(value) and value >= 0


def _text(value) -> bool:
    return isinstance(value, str)


NUMBER_KEY_FIELDS = {"keep_fraction": (lambda v: _number(v) and 0 < v <= 1, "a number in (0, 1]"),
                     "length": (lambda v: _integer(v) and v >= 1, "an integer >= 1"),
                     "item": (_count, "an integer >= 0"), "question": (_count, "an integer >= 0"),
                     "seed": (_count, "an integer >= 0")}
"""The key fields that hold numbers, each valid value and what is allowed (the CLI's and the library's ranges); every
other key field holds text."""


def key_problem(row: dict) -> str | None:
    """What is wrong with the key of ``row`` (:data:`~bench.store.row_fields.KEY_FIELDS`), or None: each number of its
    type and range (:data:`NUMBER_KEY_FIELDS`), every other key field text (``artifacts`` absent from rows written
    before it). A row's key is hashed and compared only once it has none: a list or a dict there is named, not
    hashed."""
    for field in KEY_FIELDS:
        value = row.get(field)
        if value is None and field in OPTIONAL_FIELDS:
            continue
        valid, allowed = NUMBER_KEY_FIELDS.get(field, (_text, "text"))
        if not valid(value):
            return f"{field}={reprlib.repr(value)} (expected {allowed})"
    return None


def _setting_problem(row: dict) -> str | None:
    """The first key value no run writes, of a key of its types: a task no family builds, a template profile,
    engine, dtype or device the CLI refuses, a ``weights`` that is not the fingerprint of the row's ``model_parts``,
    a no-prune row (press and allocator ``none``) at another kept fraction than 1 or beside
    a compacting press or allocator, or a label that does not read back as itself (:func:`_label_problem`)."""
    for field, known in (("task", ALL_TASKS), ("profile", PROFILES), ("engine", ENGINES)):
        if row[field] not in known:
            return f"{field}={reprlib.repr(row[field])} (expected one of {', '.join(known)})"
    if row.get("dtype") is not None and row["dtype"] not in DTYPES:
        return f"dtype={reprlib.repr(row['dtype'])} (expected one of {', '.join(DTYPES)})"
    if row.get("device") is not None and not DEVICE.fullmatch(row["device"]):
        return f"device={reprlib.repr(row['device'])} (expected cpu, cuda or cuda:N)"
    parts = row.get("model_parts")
    if parts is not None:
        if not (isinstance(parts, dict) and parts and all(map(_text, parts.values()))):
            return f"model_parts={reprlib.repr(parts)} (expected {{part: its fingerprint}}, each text)"
        if row["weights"] != fingerprint_of_parts(parts):
            return (f"weights={row['weights']!r} (expected {fingerprint_of_parts(parts)!r}, the fingerprint of its "
                    f"model_parts {reprlib.repr(parts)}: one model, one fingerprint)")
    for field in ("code", CARRIED_FROM):  # probe 18: verify and publish took codes that carry then refused
        if field in row and not (isinstance(row[field], str) and CODE.fullmatch(row[field])):
            return f"{field}={reprlib.repr(row[field])} (expected a code, 12 hex digits, as every run writes it)"
    press, allocator = row["press"], row["allocator"]
    if (press == BASELINE) != (allocator == BASELINE):
        return (f"press={press!r} with allocator={allocator!r} (expected both {BASELINE!r}, no prune, or neither: "
                "a press compacts with an allocator)")
    if press == BASELINE and row["keep_fraction"] != 1:
        return (f"keep_fraction={row['keep_fraction']!r} (expected 1 in a no-prune row: the full cache keeps every "
                "entry)")
    return _label_problem(row)


def _label_problem(row: dict) -> str | None:
    """A press or allocator label that does not read back as itself (:mod:`bench.store.label_read_back`): beside its
    setting's own label it would read as a second method of one setting (probe 17, #4)."""
    for field in ("press", "allocator"):
        problem = read_back_problem(row[field], field)
        if problem:
            return (f"{field}: {problem} (expected a label as this bench writes it: rerun that method into a store "
                    "of its own, or move its rows out)")
    return None


def _score_problem(row: dict) -> str | None:
    """A score that is not its task's metric of its prediction and answers, where the metric reads those alone
    (RULER's, :data:`workloads.tasks.ruler.METRIC`); SCBench's scorers read the turn's label and options, which rows
    do not hold."""
    metric = METRIC.get(row["task"])
    if metric is None or row.get("prediction") is None or row.get("answers") is None:
        return None
    expected = METRICS[metric](row["prediction"], row["answers"])
    if row["score"] != expected:
        return (f"score={row['score']!r} (expected {expected!r}: {metric} of its prediction "
                f"{reprlib.repr(row['prediction'])} and answers {reprlib.repr(row['answers'])})")
    return None


def _count_problem(row: dict) -> str | None:
    """The context's and the child's sizes, where a row records them: ``n_context`` tokens (at most the row's
    ``length``: an item is fitted so that its context, its longest question and that answer's budget take at most
    ``length`` tokens), ``protected`` of them kept by every method, ``body_entries`` attention entries a press chooses
    among, the ``kept_entries`` of a compacted child (at most all of them), and the child's ``kv_bytes`` of attention
    cache and ``recurrent_bytes`` of recurrent state."""
    bounds = [("n_context", "length"), ("protected", "n_context"), ("body_entries", None),
              ("kept_entries", "body_entries"), ("kv_bytes", None), ("recurrent_bytes", None)]
    for field, bound in bounds:
        value, limit = row.get(field), row.get(bound) if bound else None
        if value is None:
            continue
        if not _count(value) or (_count(limit) and value > limit):
            within = f" at most {bound} = {limit}" if _count(limit) else ""
            return f"{field}={value!r} (expected an integer >= 0{within})"
    return None


def _budget_problem(row: dict) -> str | None:
    """A compacted child's ``kept_entries`` that is not its allocator's exact budget, where its row records the
    context's ``body_entries``: each allocator's counts sum to ``heads · round(p · (n_context − protected))``
    (:attr:`allocators.base.BudgetRequest.total`), ``heads`` the attention heads ``body_entries`` counts entries of
    (``body_entries`` is ``heads · (n_context − protected)``)."""
    kept, body = row.get("kept_entries"), row.get("body_entries")
    if kept is None or body is None:
        return None
    n_body = row["n_context"] - row["protected"]
    if n_body < 1 or body % n_body:
        return (f"body_entries={body} (expected a multiple of n_context − protected = {n_body} >= 1: that many "
                "entries of each attention head a press chooses among)")
    heads, per_head = body // n_body, round_half_up(row["keep_fraction"] * n_body)
    if kept != heads * per_head:
        return (f"kept_entries={kept} (expected {heads * per_head}: round(p · (n_context − protected)) = "
                f"round({row['keep_fraction']:g} · {n_body}) = {per_head} entries for each of the {heads} attention "
                "heads of body_entries, the allocator's exact budget)")
    return None


def _fraction(value) -> bool:
    return _number(value) and 0 <= value <= 1


RECALL_MEANS = {"needle_recall": "needle_recall_layers", "answer_recall": "answer_recall_layers"}
"""A recall and the per-layer values it is the mean of, over every (attention layer, KV head)."""
NEEDLE_FIELDS = ("needle_recall", "needle_recall_layers", "answer_recall", "answer_recall_layers")
"""A needle question's child holds them all (and ``answer_rank_layers``, None where the scores stay in the engine),
another row none."""


def _per_layer_problem(row: dict) -> str | None:
    """The first value of a :data:`PER_LAYER_FRACTION_FIELDS` field that is not a fraction, or its wrong shape: every
    such field of a row ``{attention layer index: [one value per KV head]}`` over the same layers and heads; a recall
    other than the mean of its per-layer values (:data:`RECALL_MEANS`)."""
    shape, shaped_by = None, None
    for field in PER_LAYER_FRACTION_FIELDS:
        layers = row.get(field)
        if layers is None:
            continue
        if not (isinstance(layers, dict) and layers and all(isinstance(heads, list) and heads
                                                            for heads in layers.values())):
            return f"{field}={reprlib.repr(layers)} (expected {{layer: [a number in [0, 1] per head]}}, not empty)"
        for layer, heads in layers.items():
            if not (isinstance(layer, str) and layer.isdecimal()):
                return f"{field} has the layer {layer!r} (expected an attention layer's index, e.g. '7')"
            for head, value in enumerate(heads):
                if not _fraction(value):
                    return f"{field}[{layer!r}][{head}]={value!r} (expected a number in [0, 1])"
        mine = layer_layout(layers)
        if shape is None:
            shape, shaped_by = mine, field
        elif mine != shape:
            return (f"{field} holds layers and heads {layout_text(mine)}, and {shaped_by} {layout_text(shape)} "
                    "(expected one value per attention layer and KV head of the model in each)")
    present = [field for field in NEEDLE_FIELDS if row.get(field) is not None]
    if present and len(present) < len(NEEDLE_FIELDS) and row["press"] != BASELINE:  # a no-prune row holds none
        missing = [field for field in NEEDLE_FIELDS if field not in present]
        return (f"{', '.join(present)} without {', '.join(missing)} (expected all of {', '.join(NEEDLE_FIELDS)} in a "
                "child of a needle question, or none)")
    for field, layers_field in RECALL_MEANS.items():
        value, layers = row.get(field), row.get(layers_field)
        if value is not None and layers is not None:
            mean = mean_over_heads(layers)
            if abs(value - mean) > MEAN_TOLERANCE:
                return f"{field}={value!r} (expected the mean of {layers_field} over every layer and head, {mean!r})"
    return None


def layer_layout(layers: dict[str, list]) -> dict[str, int]:
    """``{layer: heads}`` of a per-layer field: which attention layers it holds, and how many KV heads each."""
    return {layer: len(heads) for layer, heads in layers.items()}


def layout_text(layers: dict[str, int]) -> str:
    return "{" + ", ".join(f"{layer}: {count} head(s)" for layer, count in layers.items()) + "}"


def _run_problem(row: dict) -> str | None:
    """What is wrong with the run a row names (:data:`RUN`), or None (also for a row written before runs were
    recorded): a run named beside its questions (:data:`QUESTIONS`) and its batch only beside both (the code that
    records one records the others), its prediction and answers held, its fields of their types, and the row's
    context one its shard took."""
    run = row.get(RUN)
    if (run is None) != (row.get(QUESTIONS) is None) or (run is None and row.get(BATCH) is not None):
        held = [field for field in (RUN, QUESTIONS, BATCH) if row.get(field) is not None]
        return (f"{' and '.join(held)} without {' and '.join(f for f in (RUN, QUESTIONS) if f not in held)} "
                f"(expected {RUN} and {QUESTIONS} together: a run that records its questions records itself, and "
                f"{BATCH} only beside them)")
    if run is None:
        return None
    if row.get("prediction") is None or row.get("answers") is None:
        return (f"no {'prediction' if row.get('prediction') is None else 'answers'} in a row that records its run "
                "(expected both: every run that records itself records what was answered and the reference)")
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


NATS_MAX = 1e6
"""The largest NLL, ΔNLL or KL a row may hold, in nats. An NLL and a KL are float32 sums and means
(:mod:`bench.run.fidelity`), but no language model's softmax spans logits 1e6 nats apart (the published rows stay
under 33): a value past it is a damaged row, which reports would print as a 300-digit mean (and past float32's
largest, as ``nan``)."""
NATS_RANGE = f"a finite number in [0, {NATS_MAX:g}] nats: a sum of a language model's log-probabilities"
KL_RANGE = (f"a finite number in [-{KL_TOLERANCE:g}, {NATS_MAX:g}] nats: a mean KL divergence of two distributions "
            "(below 0 by rounding only)")


def row_problem(row: dict) -> str | None:
    """What is wrong with one row, or None: every key and fidelity field present; its key of its types and ranges
    (:func:`key_problem`) and settings a run writes (:func:`_setting_problem`); its schema one this version reads; every
    fraction (:data:`FRACTION_FIELDS`, :data:`PER_LAYER_FRACTION_FIELDS`) in [0, 1]; answer_nll (a negative
    log-likelihood) and kl finite numbers in [0, :data:`NATS_MAX`], delta_nll a finite number of at most that size;
    agree a boolean; every time (``*_seconds``) a finite number in [0, :data:`SECONDS_MAX`]; its batch a digest
    (:data:`BATCH`); its prediction text and its answers a non-empty list of text, its score their metric's
    (:func:`_score_problem`); the context's counts within its size and the child's bytes
    integers >= 0 (:func:`_count_problem`), the context's size one its length was fitted to
    (:func:`~bench.store.context_fit.fit_problem`), a child's kept entries its allocator's budget
    (:func:`_budget_problem`); its context one of its run's shard (:func:`_run_problem`); and a no-prune row — the
    full cache compared with itself — at exactly zero ΔNLL and KL, agreeing."""
    missing = [f for f in (*KEY_FIELDS, "score", *FIDELITY_FIELDS) if row.get(f) is None and f not in OPTIONAL_FIELDS]
    if missing:
        return f"missing {', '.join(missing)}"
    problem = key_problem(row) or _setting_problem(row)
    if problem:
        return problem
    seconds = [field for field in row if field.endswith(SECONDS)]
    checks = [("schema", lambda v: v is None or (_integer(v) and 1 <= v <= SCHEMA),
               f"an integer in 1 … {SCHEMA}: this version writes {SCHEMA}, rows written before it less"),
              *((field, lambda v: v is None or _fraction(v), "a number in [0, 1]") for field in FRACTION_FIELDS),
              ("answer_nll", lambda v: _number(v) and 0 <= v <= NATS_MAX, NATS_RANGE),
              ("delta_nll", lambda v: _number(v) and abs(v) <= NATS_MAX,
               f"a finite number in [-{NATS_MAX:g}, {NATS_MAX:g}] nats: a difference of two NLLs"),
              ("kl", lambda v: _number(v) and -KL_TOLERANCE <= v <= NATS_MAX, KL_RANGE),
              ("agree", lambda v: isinstance(v, bool), "true or false"),
              *((field, lambda v: v is None or (_number(v) and 0 <= v <= SECONDS_MAX),
                 f"a finite number of seconds in [0, {SECONDS_MAX:g}]") for field in seconds),
              ("prediction", lambda v: v is None or _text(v), "text"),
              (BATCH, lambda v: v is None or (_text(v) and len(v) == 16 and set(v) <= set("0123456789abcdef")),
               "16 hexadecimal digits, a digest of the padded batch that answered it"),
              ("answers", lambda v: v is None or (isinstance(v, list) and v and all(map(_text, v))),
               "a non-empty list of text")]
    for field, valid, allowed in checks:
        if not valid(row.get(field)):
            return f"{field}={reprlib.repr(row.get(field))} (expected {allowed})"
    problem = (_score_problem(row) or _per_layer_problem(row) or _count_problem(row) or fit_problem(row)
               or _budget_problem(row) or _run_problem(row))
    if problem:
        return problem
    held = next((field for field in CHILD_ONLY if row.get(field) is not None), None)
    if row["press"] == BASELINE and held is not None:
        return (f"{held}={reprlib.repr(row[held])} in a no-prune row (expected none: the full cache keeps every entry "
                "and is scored by no press)")
    if row["press"] == BASELINE and row.get(BATCH) is not None:
        return (f"{BATCH}={row[BATCH]!r} in a no-prune row (expected none: the full cache answers alone, in no "
                "padded batch)")
    if row["press"] == BASELINE and (row["delta_nll"] != 0 or row["kl"] != 0 or row["agree"] is not True):
        return (f"the no-prune row has delta_nll={row['delta_nll']}, kl={row['kl']}, agree={row['agree']} "
                "(expected exactly 0, 0, true)")
    return None

"""What a result row holds: the fields that key it, group it and name its run, and how messages name a row.

A row is one answered question, keyed by every setting that produced it (:data:`KEY_FIELDS`); rows are averaged only
within one group of settings (:data:`GROUP_FIELDS`), and each names the run (and the shard of it) that wrote it
(:data:`RUN`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from runtime.errors import UsageError

KEY_FIELDS = ("model", "weights", "artifacts", "press", "allocator", "keep_fraction", "task", "profile", "length",
              "item", "question", "seed", "code", "method_code", "engine", "dtype", "device", "haystack")
GROUP_FIELDS = ("model", "weights", "artifacts", "profile", "length", "code", "engine", "dtype", "device")
"""Rows are averaged only within one group of these settings; ``code`` is the code every row of the group runs
(:func:`bench.store.code_version.code_version`)."""
CARRIED_FROM = "carried_from"
"""The field by which a row carried to a later code (``bench carry``) names the code it was computed by: its history,
not a value (two copies of a row may differ in it)."""
METHOD_CODE = "method_code"
"""The field by which a row names its method's own code (:func:`bench.store.code_version.method_codes`): what its press
and allocator run beyond the group's ``code``. One method of a group holds one method code: an edited press's rows
are another result, never pooled with its old ones (:func:`bench.store.method_identity.check_one_method_code`). Rows
written before it lack it; their ``code`` hashed all the code a row ran, method included."""
CONTEXT_SHA = "context_sha"
"""The field by which a row names the text it answered from: the first 16 hex digits of the SHA-256 of its context's
token ids (:func:`runtime.context_hash`). A haystack of real text reads the machine's files (``manpages``: its
manual pages), so one task, item and haystack may be another text on another machine; rows of one context agree on
it, so that a method run elsewhere never joins a group's contexts with other texts. Rows written before it lack it."""
BASELINE_CODE = "none"
"""No prune's method code: it runs nothing but the group's code."""
CODE = re.compile(r"[0-9a-f]{12}")
"""The form of a code a record names: the first 12 hex digits of a SHA-256, as the bench computes every code."""
SHARED_FIELDS = (*GROUP_FIELDS, "seed")
"""What every row of one run shares: its group and its seed (the shards of a run share them too)."""
BASELINE = "none"
"""The no-prune method's name in rows (its press and its allocator)."""
ENGINES = ("hf", "vllm")
"""The engines a row names: ``hf``, this project's runtime on a transformers model; ``vllm``, compaction inside vLLM
(:mod:`serving`)."""
SCHEMA = 2
"""Version of a row's fields; 2 added the fidelity metrics (answer_nll, delta_nll, kl, agree). Fields added since
without changing what the others mean (:data:`RUN`, :data:`QUESTIONS`, :data:`BATCH`) leave it as it is: rows
written before them lack them and are read, checked and compared with new rows as before
(:mod:`bench.store.legacy_rows`)."""
FIDELITY_FIELDS = ("answer_nll", "delta_nll", "kl", "agree")
FRACTION_FIELDS = ("score", "score_official", "needle_recall", "answer_recall")
"""Fields that hold one fraction in [0, 1] (accuracy, the share of the needle's entries kept); ``score`` is
required, the others are absent where they do not apply."""
PER_LAYER_FRACTION_FIELDS = ("needle_recall_layers", "answer_recall_layers", "answer_rank_layers")
"""Fields that hold ``{layer: [one fraction in [0, 1] per KV head]}``: recalls, and the answer tokens' percentile rank
under the press's scores (None where the scores stay in the engine)."""
RUN = "run"
"""The field by which a row names its run: ``{"tasks": [...], "n": n, "haystack": name, "shard": k, "shards": N}``.
The run answers items 0 … n − 1 of each task, in that order (its contexts, at positions 0, 1, …), on that haystack;
its shard ``k/N`` took the positions k, k + N, … (an unsharded run is shard 0/1). Rows written before it lack it
(every committed store): their stores are checked context by context only (:mod:`bench.store.completeness`)."""
RUN_FIELDS = ("tasks", "n", "haystack", "shard", "shards")
BATCH = "batch"
"""The field by which a compacted child's row names the padded batch that answered its question: a digest of the
children forked into that batch and of those answered in that pass (their methods at their kept fractions,
:func:`bench.run.rows.batch_digest`). A method's values depend, in their last digits, on what shares its batch (other
shapes, other sums), so two runs that both hold a method may hold its rows with other values; ``bench merge`` keeps
one copy of each where the batches differ, and refuses two values from one batch. No-prune rows (answered alone)
and rows written before it lack it."""
QUESTIONS = "questions"
"""The field by which a row records how many questions its context has: its questions are 0 … questions − 1, and
a context is whole when each of its methods holds the row of each (:mod:`bench.store.completeness`). Rows written before
it lack it (every committed store): their contexts are checked on the questions their rows hold."""


def row_key(row: dict) -> tuple:
    """The settings that produced ``row`` (:data:`KEY_FIELDS`): a store holds one row per key."""
    return tuple(row.get(field) for field in KEY_FIELDS)


class ShardContexts(Sequence):
    """``(task, item)`` of every context of the shard a run (:data:`RUN`) names, in order, computed from its position
    when read: its positions k, k + N, … of the list of every task's items 0 … n − 1, without holding that list
    (``--n 100000000`` is as cheap as ``--n 1``).

    Parameters
    ----------
    run : dict
        ``tasks``, ``n``, ``shard`` k of ``shards`` N.
    """

    def __init__(self, run: dict):
        self.tasks, self.n = list(run["tasks"]), run["n"]
        self.positions = range(run["shard"], len(self.tasks) * self.n, run["shards"])

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, index: int) -> tuple[str, int]:
        position = self.positions[index]  # an IndexError past the end ends iteration
        return self.tasks[position // self.n], position % self.n

    def __contains__(self, context) -> bool:
        task, item = context
        return isinstance(item, int) and 0 <= item < self.n and any(
            name == task and at * self.n + item in self.positions for at, name in enumerate(self.tasks))


MAX_ITEMS = 10**9
"""Most items a task of one run may ask for (``--n``): a run's contexts are listed lazily, but their count must be
an index, and a billion contexts is past any benchmark."""


def check_items(n: int, flag: str = "--n") -> None:
    """``UsageError`` naming ``n`` (``flag``) unless it is in [1, :data:`MAX_ITEMS`]."""
    if not 1 <= n <= MAX_ITEMS:
        raise UsageError(f"{flag} {n}: give between 1 and {MAX_ITEMS:,} items per task")


def shard_contexts(run: dict) -> ShardContexts:
    """``(task, item)`` of every context of the shard ``run`` (:data:`RUN`) names, in order (lazily)."""
    return ShardContexts(run)


def shards_with_contexts(run: dict) -> range:
    """The shards of ``run`` (:data:`RUN`) that hold a context: the first of its N, at most one a context (a split
    into more shards than contexts leaves the rest empty), so that checking every shard costs the contexts, not N."""
    return range(min(run["shards"], len(run["tasks"]) * run["n"]))


def method_of(row: dict) -> str:
    """A row's method as reports name it: ``press/allocator``, or ``none`` for no prune."""
    return BASELINE if row["press"] == BASELINE else f"{row['press']}/{row['allocator']}"


def shown_fraction(fraction: float) -> str:
    """A kept fraction as reports and messages show it: 6 significant digits (``0.3`` for 0.3 and 0.3000001). Two
    fractions shown alike are one setting to a reader, so a run and a store hold at most one of them."""
    return f"{fraction:g}"


def method_at(row: dict) -> str:
    """A row's method at its kept fraction (``gatesight/flat p=0.1``), as messages name it."""
    return f"{method_of(row)} p={shown_fraction(row['keep_fraction'])}"


def describe_row(row: dict) -> str:
    """A row as messages name it: its method, kept fraction, task, item and question."""
    return (f"{method_of(row)} at p={shown_fraction(row['keep_fraction'])}, task {row['task']}, item {row['item']}, "
            f"question {row['question']}")


def mean_over_heads(per_layer: dict[str, list[float]]) -> float:
    """The mean over every (layer, head) of a per-layer, per-head diagnostic."""
    values = [v for heads in per_layer.values() for v in heads]
    return sum(values) / len(values)


RUN_SHARED = ("tasks", "n", "haystack", "shards")
"""What the rows of every shard of one run name alike of their run (:data:`bench.store.row_fields.RUN`): all but the
shard."""

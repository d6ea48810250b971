"""``bench compare``: every (press, allocator, kept fraction) on the same prefix-only fork protocol.

Per context: one prefill (with the union of the evidence the presses ask for), one scoring per press, one child
per (method, kept fraction), and every question of the context answered from each child (:mod:`bench.run.context_run`,
on either :mod:`bench.run.engine`). Besides accuracy every row stores the fidelity of the child against the full cache
on the same question (:mod:`bench.run.fidelity`). This module runs a comparison end to end: the plan
(:func:`bench.run.plan.plan`), the store's lock, the model's fingerprints (once), the contexts
(:mod:`bench.run.execution`) and the rows a summary reads.
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from collections.abc import Sequence
from contextlib import closing

from tqdm import tqdm

from pretrained import loading
from runtime.errors import UsageError
from workloads.tasks import registry as tasks

from ..store.completeness import listed
from ..store.method_identity import check_run_method_codes
from ..store.result_store import ResultStore
from ..store.row_fields import GROUP_FIELDS, KEY_FIELDS, RUN, ShardContexts, method_at, shard_contexts, shown_fraction
from ..store.store_checks import check_stores
from .execution import ContextJob, in_processes, in_this_process
from .harness import Harness
from .label_settings import check_labels_rebuild
from .plan import RunPlan, plan
from .ray_workers import in_ray
from .settings import CompareSettings

__all__ = ["CompareSettings", "RunPlan", "contexts_of", "execute", "plan", "run_compare", "run_rows"]


def run_compare(settings: CompareSettings | RunPlan, show_progress: bool = True) -> ResultStore:
    """Run (or resume) the comparison; returns the store with every row of this run."""
    return execute(plan(settings), show_progress)[0]


def execute(run: RunPlan, show_progress: bool = True) -> tuple[ResultStore, loading.ModelIdentity | None]:
    """Run (or resume) ``run``; returns the store and the model's fingerprints the rows record (computed once, here;
    None for a shard without contexts, which loads no model)."""
    check_labels_rebuild(run.methods)  # a label no reader would take is refused before the store is made
    store = ResultStore(run.out)  # takes the writer's lock before the model loads
    try:
        store.check_schema()
        check_stores([store], complete=False)  # what verify would refuse, refused before any work
        _check_fractions_resume(run, store)
        if not contexts_of(run):  # an empty shard (more shards than contexts): no model to load
            return store, None
        identity = run.model.identity
        store.check_model(run.model_dir.name, identity.row_fields())
        _say_other_code_rows(run, identity, store)
        group = {field: value for field, value in _group_fields(run, identity).items() if field in GROUP_FIELDS}
        check_run_method_codes(group, run.method_codes, store.rows, store.path)
        _check_run_completes(run, identity, store)
        _run(run, identity, store, show_progress)
    finally:
        store.close()
    return store, identity


def _say_other_code_rows(run: RunPlan, identity: loading.ModelIdentity, store: ResultStore) -> None:
    """A line on stderr where ``store`` holds rows of this run's model and settings under another code version:
    a row records the code that computed it, so they are not resumed; the run starts anew beside them (after a
    ``git pull``, a resumed run would otherwise redo its finished contexts without a word)."""
    mine = _group_fields(run, identity)
    del mine["code"]
    other = sorted({row["code"] for row in store.rows
                    if row.get("code") != run.code and all(row.get(k) == v for k, v in mine.items())})
    if other:
        count = sum(1 for row in store.rows if row.get("code") in other)
        print(f"note: {store.path} holds {count} rows of this model and settings computed by another code version "
              f"({', '.join(other)}): they are kept, and reported apart from this run's; this run (code "
              f"{run.code}) does not resume them and starts anew", file=sys.stderr)


def _group_fields(run: RunPlan, identity: loading.ModelIdentity) -> dict:
    """``{field: value}`` that every row of ``run`` holds and that sets its setting group apart
    (:data:`~bench.store.row_fields.SHARED_FIELDS`): rows of one group are compared on the same contexts."""
    return {"model": run.model_dir.name, "weights": identity.weights, "artifacts": identity.artifacts,
            "code": run.code, "length": run.length, "profile": run.profile, "seed": run.seed, "engine": run.engine,
            "dtype": run.dtype, "device": run.device}


def _check_run_completes(run: RunPlan, identity: loading.ModelIdentity, store: ResultStore) -> None:
    """``UsageError`` where ``store`` holds rows of ``run``'s setting group that the run, once finished, would leave
    incomplete: a group's every context holds every method at every fraction the group holds (what ``bench
    verify`` asks), and the run adds its methods to its contexts only. A run of other methods on contexts the store
    does not hold, of new methods that leave out contexts the store holds, or a shard of another ``--shard K/N``
    split of the same run, could never be verified; a resumed run, a larger ``--n`` or another shard of the same
    split and methods, and more methods on the same contexts are fine."""
    group = _group_fields(run, identity)
    held: dict[tuple, set[str]] = defaultdict(set)
    mine_run = {field: run.run[field] for field in ("tasks", "n", "haystack")}
    for row in store.rows:
        if all(row.get(k) == v for k, v in group.items()):
            held[(row["task"], row.get("haystack", tasks.GENERATED), row["item"])].add(method_at(row))
            other = row.get(RUN)
            if (other and other["tasks"] != mine_run["tasks"] and sorted(other["tasks"]) == sorted(mine_run["tasks"])
                    and other["n"] == run.n and run.run["shards"] > 1):
                raise UsageError(f"{store.path} holds a run of --tasks {','.join(other['tasks'])}, and this shard "
                                 f"is of --tasks {','.join(mine_run['tasks'])}: a shard's contexts follow the order "
                                 f"of --tasks, so the shards of one run give them in one order. Give --tasks "
                                 f"{','.join(other['tasks'])}, or write to another --out")
            if other and all(other[k] == v for k, v in mine_run.items()) and other["shards"] != run.run["shards"]:
                split = f"--shard K/{other['shards']}" if other["shards"] > 1 else "no --shard"
                raise UsageError(f"{store.path} holds shard {other['shard']}/{other['shards']} of this run (same "
                                 f"--tasks, --n and --haystack), and this one is shard {run.run['shard']}/"
                                 f"{run.run['shards']}: the shards of one run are of one --shard K/N split (one N), "
                                 f"or their contexts overlap and some are never run. Give {split}, or write to "
                                 "another --out")
    if not held:
        return
    mine = {method_at({"press": method.press.label, "allocator": method.allocator.label, "keep_fraction": p})
            for method, p in run.children}
    contexts = contexts_of(run)
    stored = set().union(*held.values())
    answered = {context for context in held
                if (context[0], context[2]) in contexts and context[1] == tasks.haystack_of(context[0], run.haystack)}
    only_stored = stored - mine
    if only_stored and len(answered) < len(contexts):
        task, item = next(c for c in contexts if (c[0], tasks.haystack_of(c[0], run.haystack), c[1]) not in held)
        raise UsageError(f"{store.path} holds rows of {listed(sorted(only_stored))} in this setting group, and this "
                         f"run would answer task {task}, item {item} without them: a report compares methods on "
                         f"the same contexts, so the store could not be verified. Add them to --methods / "
                         f"--keep-fractions (the run resumes and adds only what is missing), or write to another "
                         f"--out")
    every = stored | mine
    for context, methods in sorted(held.items()):
        lacking = every - (methods | mine if context in answered else methods)
        if not lacking:
            continue
        if context in answered:
            raise UsageError(f"{store.path} holds task {context[0]}, item {context[2]} without the rows of "
                             f"{listed(sorted(lacking))} (the run that wrote it stopped before them), and this run "
                             f"answers it without them: the store could not be verified. Add them to --methods / "
                             f"--keep-fractions (the run resumes and adds only what is missing), or write to another "
                             f"--out")
        raise UsageError(f"{store.path} holds task {context[0]}, item {context[2]}, which this run does not "
                         f"answer (--tasks {','.join(run.tasks)}, --n {run.n}"
                         f"{f', --shard {run.shard[0]}/{run.shard[1]}' if run.shard else ''}), and it would lack the "
                         f"rows of {listed(sorted(lacking))}: a report compares methods on the same contexts, so the "
                         f"store could not be verified. Give --tasks and --n that include it, or write to another "
                         f"--out")


def _check_fractions_resume(run: RunPlan, store: ResultStore) -> None:
    """``UsageError`` naming a kept fraction of ``run`` that differs from one ``store`` holds of the same method but
    is shown alike (:func:`~bench.store.row_fields.shown_fraction`: 0.3000001 and 0.3): its rows would be a second
    setting that reports show as the stored one. The stored fraction, given as stored, resumes it."""
    stored: dict[tuple[str, str], set[float]] = defaultdict(set)
    for row in store.rows:
        stored[(row["press"], row["allocator"])].add(row["keep_fraction"])
    for method, p in run.children:
        held = next((f for f in sorted(stored[(method.press.label, method.allocator.label)])
                     if f != p and shown_fraction(f) == shown_fraction(p)), None)
        if held is not None:
            raise UsageError(f"kept fraction {p!r} (--keep-fractions) of {method.label}: {store.path} holds its rows "
                             f"at {held!r}, one fraction where reports show them (p={shown_fraction(p)}); give "
                             f"{held!r} to resume them, or write to another --out")


def run_rows(store: ResultStore, settings: CompareSettings | RunPlan,
             identity: loading.ModelIdentity | None = None) -> list[dict]:
    """The rows of ``store`` that this run produces (its model, weights and code version included), so that a
    summary never mixes in other runs written to the same directory. ``identity``: the model's fingerprints the run's
    rows record (what :func:`execute` returns); computed here if not given. The store first passes the checks of
    ``bench verify`` but completeness (:func:`bench.store.store_checks.check_stores`): no summary averages a value out
    of its range, or a key held twice."""
    check_stores([store], complete=False)
    run = plan(settings)
    identity = identity or run.model.identity
    wanted = _group_fields(run, identity)
    children = {(method.press.label, method.allocator.label, float(p)) for method, p in run.children}
    contexts = contexts_of(run)
    return [r for r in store.rows if all(r.get(k) == v for k, v in wanted.items())
            and (r["task"], r["item"]) in contexts
            and r.get("haystack", tasks.GENERATED) == tasks.haystack_of(r["task"], run.haystack)
            and (r["press"], r["allocator"], float(r["keep_fraction"])) in children]


def _jobs(run: RunPlan, store: ResultStore) -> Sequence[ContextJob]:
    """The context of every job with the keys the store holds of it, made as each is read."""
    done_by_context: dict[tuple, set] = {}
    task_at, item_at = KEY_FIELDS.index("task"), KEY_FIELDS.index("item")
    for key in store.done:
        done_by_context.setdefault((key[task_at], key[item_at]), set()).add(key)
    return _Jobs(contexts_of(run), done_by_context)


class _Jobs(Sequence):
    """:class:`ContextJob` of each context, in order, made when read (a run of many contexts starts at once)."""

    def __init__(self, contexts: Sequence[tuple[str, int]], done_by_context: dict[tuple, set]):
        self.contexts, self.done_by_context = contexts, done_by_context

    def __len__(self) -> int:
        return len(self.contexts)

    def __getitem__(self, index: int) -> ContextJob:
        task, item = self.contexts[index]
        return ContextJob(task, item, frozenset(self.done_by_context.get((task, item), ())))


def contexts_of(run: RunPlan) -> ShardContexts:
    """``(task, index)`` of every context the run answers, in order; a shard ``k/n`` takes positions k, k + n, ...
    (:func:`bench.store.row_fields.shard_contexts` of the run its rows name)."""
    return shard_contexts(run.run)


def _run(run: RunPlan, identity: loading.ModelIdentity, store: ResultStore, show_progress: bool) -> None:
    jobs = _jobs(run, store)
    per_context = len(run.children)
    # a worker answers one context at a time and loads its own model: workers beyond the contexts only cost memory
    workers = min(run.jobs, len(jobs))
    # in this process, the model is loaded and every press checked on it before the progress bar starts
    harness = Harness(run, identity) if run.executor == "local" and workers <= 1 else None
    bar = tqdm(total=len(jobs) * per_context, disable=not show_progress, unit="fork", desc="compare")
    if workers < run.jobs:
        print(f"note: --jobs {run.jobs} capped at {workers}: the run has {len(jobs)} context(s)", file=sys.stderr)
    if run.executor == "local" and workers > (os.cpu_count() or 1):
        print(f"warning: {workers} worker processes on {os.cpu_count()} CPU core(s): each loads the model and "
              "wants a core of its own; they will compete", file=sys.stderr)
    try:
        if harness is not None:
            for _ in in_this_process(harness, jobs, store.has, store.append):
                bar.update(per_context)
        else:
            # only this process writes the store, whoever answers the contexts; it loads no model itself
            results = (in_ray(run, identity, jobs, workers) if run.executor == "ray"
                       else in_processes(run, identity, jobs, workers))
            with closing(results):  # its workers stopped now, whatever stops this loop
                for rows in results:
                    for row in rows:
                        store.append(row)
                    bar.update(per_context)
    finally:  # an error then starts on a line of its own
        bar.close()

"""``bench compare``: every (press, allocator, kept fraction) on the same prefix-only fork protocol.

Per context: one prefill (with the union of the evidence the presses ask for), one scoring per press (a
:class:`presses.Selection`), one fork per (allocator, kept fraction), and every question of the context answered
from each child (:mod:`bench.context_run`). Besides accuracy every row stores the fidelity of the child against the
full cache on the same question (:mod:`bench.fidelity`). This module runs a comparison end to end: validation,
the store's lock, the harness, the contexts (:mod:`bench.execution`) and the rows a summary reads.
"""

from __future__ import annotations

import os
import sys

from tqdm import tqdm

from pretrained import loading
from workloads.tasks import registry as tasks

from .completeness import check_stores
from .execution import ContextJob, in_processes, in_ray, in_this_process
from .harness import Harness
from .rows import run_of
from .settings import CheckedSettings, CompareSettings, validate
from .store import KEY_FIELDS, ResultStore, shard_contexts

__all__ = ["CheckedSettings", "CompareSettings", "contexts_of", "run_compare", "run_rows", "validate"]


def run_compare(settings: CompareSettings, show_progress: bool = True) -> ResultStore:
    """Run (or resume) the comparison; returns the store with every row of this run."""
    settings = validate(settings)
    store = ResultStore(settings.out)  # takes the writer's lock before the model loads
    try:
        store.check_schema()
        check_stores([store], complete=False)  # what verify would refuse, refused before any work
        if not contexts_of(settings):  # an empty shard (more shards than contexts): no model to load
            return store
        harness = Harness(settings)
        store.check_model(str(harness.model_dir.name), harness.identity.row_fields())
        _run(harness, store, show_progress)
    finally:
        store.close()
    return store


def run_rows(store: ResultStore, settings: CompareSettings) -> list[dict]:
    """The rows of ``store`` that this run's settings produce (its model, weights and code version included), so
    that a summary never mixes in other runs written to the same directory. ``settings`` as given to
    :func:`run_compare` or checked (:func:`validate`): the rows name the typed options. The store first passes the
    checks of ``bench verify`` but completeness (:func:`bench.completeness.check_stores`): no summary averages a
    value out of its range, or a key held twice."""
    check_stores([store], complete=False)
    settings = settings if isinstance(settings, CheckedSettings) else validate(settings)
    model_dir = loading.resolve(settings.model)
    identity = loading.identity(model_dir)
    wanted = {"model": model_dir.name, "weights": identity.model, "artifacts": identity.artifacts,
              "code": settings.code, "length": settings.length, "profile": settings.profile,
              "seed": settings.seed,
              "engine": settings.engine, "dtype": loading.dtype_name(settings.model),
              "device": loading.device_name(settings.model)}
    methods = {(press, allocator, float(p)) for press, allocator, p in settings.methods()}
    contexts = set(contexts_of(settings))
    return [r for r in store.rows if all(r.get(k) == v for k, v in wanted.items())
            and (r["task"], r["item"]) in contexts
            and r.get("haystack", tasks.GENERATED) == tasks.haystack_of(r["task"], settings.haystack)
            and (r["press"], r["allocator"], float(r["keep_fraction"])) in methods]


def _jobs(settings: CompareSettings, store: ResultStore) -> list[ContextJob]:
    done_by_context: dict[tuple, set] = {}
    task_at, item_at = KEY_FIELDS.index("task"), KEY_FIELDS.index("item")
    for key in store.done:
        done_by_context.setdefault((key[task_at], key[item_at]), set()).add(key)
    return [ContextJob(task, index, frozenset(done_by_context.get((task, index), ())))
            for task, index in contexts_of(settings)]


def contexts_of(settings: CompareSettings) -> list[tuple[str, int]]:
    """``(task, index)`` of every context the run answers, in order; a shard ``k/n`` takes positions k, k + n, ...
    (:func:`bench.store.shard_contexts` of the run its rows name)."""
    return shard_contexts(run_of(settings))


def _run(harness: Harness, store: ResultStore, show_progress: bool) -> None:
    settings = harness.settings
    jobs = _jobs(settings, store)
    per_context = len(settings.methods())
    bar = tqdm(total=len(jobs) * per_context, disable=not show_progress, unit="fork", desc="compare")
    # a worker answers one context at a time and loads its own model: workers beyond the contexts only cost memory
    workers = min(settings.jobs, len(jobs))
    if workers < settings.jobs:
        print(f"note: --jobs {settings.jobs} capped at {workers}: the run has {len(jobs)} context(s)",
              file=sys.stderr)
    if settings.executor == "local" and workers > (os.cpu_count() or 1):
        print(f"warning: {workers} worker processes on {os.cpu_count()} CPU core(s): each loads the model and "
              "wants a core of its own; they will compete", file=sys.stderr)
    try:
        if settings.executor == "local" and workers <= 1:
            for _ in in_this_process(harness, jobs, store.has, store.append):
                bar.update(per_context)
        else:
            # only this process writes the store, whoever answers the contexts
            results = (in_ray(settings, jobs, workers, settings.address) if settings.executor == "ray"
                       else in_processes(settings, jobs, workers))
            for rows in results:
                for row in rows:
                    store.append(row)
                bar.update(per_context)
    finally:  # an error then starts on a line of its own
        bar.close()

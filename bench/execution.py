"""Where the contexts of a comparison are answered: in this process, or by worker processes.

The unit of work is a whole context (:class:`ContextJob`): one prefill feeds every child of it. A
:class:`ContextWorker` holds a harness (its own model) and answers jobs; the driver alone writes the store, so a
store is written by one process whatever runs the contexts.
"""

from __future__ import annotations

import multiprocessing
import queue
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from .context_run import ContextRun
from .harness import Harness
from .settings import CheckedSettings


@dataclass(frozen=True)
class ContextJob:
    """Context ``index`` of ``task`` and the keys of its rows already stored (they are not answered again)."""

    task: str
    index: int
    done: frozenset = frozenset()


class ContextWorker:
    """A harness of its own answering whole contexts, one core each: decoding this small model is bound by
    per-layer Python work, not by BLAS, so more threads per process buy nothing and starve the others.

    Parameters
    ----------
    settings : CheckedSettings
        The run's settings, checked (:func:`bench.settings.validate`).
    """

    def __init__(self, settings: CheckedSettings):
        torch.set_num_threads(1)
        self.harness = Harness(settings)

    def rows(self, job: ContextJob) -> list[dict]:
        """The new rows of one context."""
        rows: list[dict] = []
        ContextRun(self.harness, job.task, job.index, job.done.__contains__, rows.append).run()
        return rows


def _serve(settings: CheckedSettings, jobs, results) -> None:
    """A worker process: answer jobs until the driver sends None; an error goes back to the driver and ends it."""
    try:
        worker = ContextWorker(settings)
        for job in iter(jobs.get, None):
            results.put(("rows", job, worker.rows(job)))
    except BaseException as error:  # noqa: BLE001 - the driver re-raises it with its own type and message
        results.put(("error", None, error))


def in_processes(settings: CheckedSettings, jobs: list[ContextJob], workers: int) -> Iterator[list[dict]]:
    """The rows of every job, context by context as workers finish them, from ``workers`` spawned processes.

    A worker's exception is raised here as it was raised there; a worker that dies without one (killed, out of
    memory) is a ``RuntimeError`` naming its exit code.
    """
    context = multiprocessing.get_context("spawn")
    pending, results = context.Queue(), context.Queue()
    for job in jobs:
        pending.put(job)
    processes = [context.Process(target=_serve, args=(settings, pending, results), daemon=True)
                 for _ in range(workers)]
    for process in processes:
        pending.put(None)
        process.start()
    try:
        for _ in jobs:
            while True:
                try:
                    kind, _, payload = results.get(timeout=1.0)
                    break
                except queue.Empty:
                    dead = [p for p in processes if not p.is_alive() and p.exitcode not in (0, None)]
                    if dead:
                        raise RuntimeError(f"a worker process died (exit code {dead[0].exitcode}) before "
                                           "finishing its context; rerun to resume") from None
            if kind == "error":
                raise payload
            yield payload
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
            process.join()


def in_this_process(harness: Harness, jobs: list[ContextJob], is_done: Callable[[tuple], bool],
                    emit: Callable[[dict], None]) -> Iterator[None]:
    """Every job answered by ``harness``, each row emitted as it is made (a killed run loses no finished row);
    yields once per context."""
    for job in jobs:
        ContextRun(harness, job.task, job.index, is_done, emit).run()
        yield None


def in_ray(settings: CheckedSettings, jobs: list[ContextJob], workers: int,
           address: str | None) -> Iterator[list[dict]]:
    """The rows of every job from ``workers`` Ray actors, each a :class:`ContextWorker` (one CPU each), context by
    context as they finish: on the cluster at ``address``, or on a Ray instance started here for the run."""
    import ray
    from ray.util import ActorPool

    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        actor = ray.remote(num_cpus=1)(ContextWorker)
        pool = ActorPool([actor.remote(settings) for _ in range(workers)])
        yield from pool.map_unordered(lambda worker, job: worker.rows.remote(job), jobs)
    finally:
        if started:
            ray.shutdown()

"""Where the contexts of a comparison are answered: in this process, or by worker processes.

The unit of work is a whole context (:class:`ContextJob`): one prefill feeds every child of it. A
:class:`ContextWorker` holds a harness (its own model, loaded once) and answers jobs; the driver alone writes the
store, so a store is written by one process whatever runs the contexts. The driver loads no model when workers
answer: it fingerprints the model directory once, and each worker checks that the model it loaded is that one.
"""

from __future__ import annotations

import importlib
import multiprocessing
import multiprocessing.connection
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from tqdm import tqdm
from transformers.utils import logging as transformers_logging

from pretrained import loading
from runtime import signals
from runtime.errors import UsageError

from .context_run import ContextRun
from .harness import Harness
from .plan import RunPlan
from .stopping import WorkerDied
from .worker_watch import BEAT_SECONDS, Feeder, WatchClock, end_worker, raise_if_silent, silence_limit

DRIVER_CHECK_SECONDS = 1.0
"""How often a worker waiting for a job looks whether its driver is still there."""



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
    run : RunPlan
    identity : ModelIdentity
        The model directory's fingerprints when the run began (the driver's): the rows record them, and a worker
        whose loaded model is another (the directory written since) refuses to answer.
    """

    def __init__(self, run: RunPlan, identity: loading.ModelIdentity):
        torch.set_num_threads(1)
        for module in run.modules:  # a user's press or allocator registers itself when its module is imported
            importlib.import_module(module)
        self.harness = Harness(run, identity)
        if run.model.changed():  # a stat of each file it hashed; their contents again only where one moved
            raise UsageError(f"{run.model_dir} changed since the run began (weights, config, tokenizer or its "
                             "artifacts were written meanwhile, e.g. by bench train or bench calibrate): a worker "
                             "loaded another model than the one the run's rows name; rerun once nothing writes "
                             "into it")

    def rows(self, job: ContextJob) -> list[dict]:
        """The new rows of one context."""
        rows: list[dict] = []
        ContextRun(self.harness, job.task, job.index, job.done.__contains__, rows.append).run()
        return rows


def _serve(run: RunPlan, identity: loading.ModelIdentity, jobs, results) -> None:
    """A worker process: answer jobs until the driver sends None or is gone; an error goes back to the driver and
    ends it. ``jobs`` and ``results`` are this worker's own pipes from and to the driver (the end of file of
    ``results`` is how the driver sees it end); a thread beats on ``results`` meanwhile (:data:`BEAT_SECONDS`)."""
    # tqdm's default lock is a named semaphore under spawn: a worker the driver terminates would leave it behind, and
    # the resource tracker would report it as leaked after the driver's last line
    tqdm.set_lock(threading.RLock())
    transformers_logging.disable_progress_bar()  # a worker's loading bars would cut through the driver's bar
    sending = threading.Lock()  # one message at a time on the pipe: the beats' thread and this one share it

    def send(message) -> None:
        with sending:
            results.send(message)

    def beat() -> None:
        try:
            while True:
                send(("beat", None))
                time.sleep(BEAT_SECONDS)
        except (OSError, ValueError):  # the driver is gone, or this worker closed the pipe as it ends
            return

    threading.Thread(target=beat, name="beat", daemon=True).start()
    try:
        worker = ContextWorker(run, identity)
        while (job := _next_job(jobs)) is not None:
            send(("rows", worker.rows(job)))
    except BaseException as error:  # noqa: BLE001 - the driver re-raises it with its own type and message
        try:
            send(("error", error))
        except OSError:  # the driver is gone: nobody reads the pipe
            pass


def _next_job(jobs) -> ContextJob | None:
    """The driver's next job from this worker's pipe, or None when it sends None or is gone (killed by SIGKILL or
    the out-of-memory killer: the worker would wait on the pipe for ever, holding a model)."""
    while multiprocessing.parent_process().is_alive():  # before each job too: the jobs queued are the driver's
        try:
            if jobs.poll(DRIVER_CHECK_SECONDS):
                return jobs.recv()
        except (EOFError, OSError):  # the driver closed its end
            return None
    return None


def in_processes(run: RunPlan, identity: loading.ModelIdentity, jobs: Iterable[ContextJob],
                 workers: int) -> Iterator[list[dict]]:
    """The rows of every job, context by context as workers finish them, from ``workers`` spawned processes.

    A worker's exception is raised here as it was raised there; a worker that ends without one (killed, out of
    memory), between jobs, in one or while sending its rows, is a :class:`WorkerDied` naming its exit code, and so
    is one silent for :func:`~bench.run.worker_watch.silence_limit` seconds (stopped, or wedged), named by its pid.
    """
    silence = silence_limit()
    context = multiprocessing.get_context("spawn")
    # One pipe each way a worker, not one queue for all: a worker's results pipe has one writer, so its death is an
    # end of file there, also part-way through a message (on a shared queue the others hold the pipe open: the
    # driver would wait for the rest of that message for ever).
    pipes = [context.Pipe(duplex=False) for _ in range(workers)]
    job_pipes = [context.Pipe(duplex=False) for _ in range(workers)]
    processes = [context.Process(target=_serve, args=(run, identity, job_reader, writer), daemon=True)
                 for (_, writer), (job_reader, _) in zip(pipes, job_pipes)]
    readers = {reader: process for (reader, _), process in zip(pipes, processes)}
    feeders = {}
    feed, fed = iter(jobs), False

    def top_up() -> None:  # two jobs ahead a worker: the others are made as they are taken (any --n)
        nonlocal fed
        for reader, feeder in feeders.items():
            while not fed and reader in readers and feeder.due < 2:
                job = next(feed, None)
                if job is None:
                    fed = True
                    for each in feeders.values():
                        each.put(None)
                else:
                    feeder.put(job)

    try:
        with signals.kept_from_children():  # a terminal's Ctrl-C stops the driver alone, which stops them
            for process in processes:
                process.start()
        for (_, writer), (job_reader, _) in zip(pipes, job_pipes):
            writer.close()  # the worker holds its own copy: the driver's would hide the worker's end of file
            job_reader.close()
        feeders = {reader: Feeder(job_writer) for reader, (_, job_writer) in zip(readers, job_pipes)}
        clock = WatchClock()  # silence counted only while the driver runs: a Ctrl-Z of the run is none
        heard, started = dict.fromkeys(readers), clock()
        top_up()
        while any(feeder.due for feeder in feeders.values()):
            if not readers:  # a worker ends as told only when idle, so not while rows are due: said, not spun on
                raise WorkerDied("every worker ended before the run finished")
            for reader in multiprocessing.connection.wait(list(readers), timeout=BEAT_SECONDS):
                try:
                    kind, payload = reader.recv()
                except (EOFError, OSError):  # the worker ended (OSError: part-way through a message)
                    _raise_if_it_died(readers.pop(reader))
                    continue
                heard[reader] = clock()
                if kind == "error":
                    raise payload
                if kind == "rows":
                    feeders[reader].due -= 1
                    top_up()
                    yield payload
            raise_if_silent({reader: f"worker process {process.pid}" for reader, process in readers.items()}, heard,
                            started, silence, clock())
    finally:
        for process in processes:
            if process.pid is not None:  # started (a stop can come while they start)
                end_worker(process)
        for (reader, writer), (job_reader, job_writer) in zip(pipes, job_pipes):
            for end in (reader, writer, job_reader, job_writer):
                end.close()


def _raise_if_it_died(process) -> None:
    """A :class:`WorkerDied` for a worker whose pipe closed while the driver still waits for rows, unless it ended
    as told (after the driver's None, exit code 0: the others answer the rest)."""
    process.join()
    if process.exitcode != 0:
        raise WorkerDied(f"a worker process died ({_how_it_ended(process.exitcode)}) before the run finished")


def _how_it_ended(exitcode: int) -> str:
    """A dead worker's exit code, in words: a negative one is the signal that killed it."""
    if exitcode < 0:
        name = signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else str(-exitcode)
        oom = ", as the out-of-memory killer does" if -exitcode == signal.SIGKILL else ""
        return f"killed by {name}{oom}"
    return f"exit code {exitcode}"


def in_this_process(harness: Harness, jobs: list[ContextJob], is_done: Callable[[tuple], bool],
                    emit: Callable[[dict], None]) -> Iterator[None]:
    """Every job answered by ``harness``, each context's rows emitted as it is done (a killed run loses no finished
    context); yields once per context."""
    for job in jobs:
        ContextRun(harness, job.task, job.index, is_done, emit).run()
        yield None

"""The contexts of a comparison answered by Ray actors (``bench compare --executor ray``), each a
:class:`~bench.run.execution.ContextWorker`, watched as the ``--jobs`` worker processes are: an actor beats (its own
thread answers :meth:`_RayWorker.beat` while another computes), and one silent too long — stopped, wedged, or never
started, as when Ray cannot start a worker process (an address-space limit, a full cluster) — is named and killed,
and the run ends in one line with what was kept (probe 24, #2: the driver waited for ever)."""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Iterable, Iterator

from pretrained import loading
from runtime.errors import UsageError

from .execution import ContextJob, ContextWorker
from .plan import RunPlan
from .settings import RAY_ADDRESS_ENV
from .stopping import WorkerDied
from .worker_watch import BEAT_SECONDS, WatchClock, raise_if_silent, silence_limit

RAY_CONNECT_SECONDS = 60.0
"""How long ``ray.init`` may take to join the cluster at ``--address``: a server that answers as gRPC but is not
Ray's (which :func:`bench.run.settings.check_ray_address` lets through) would have it retry for minutes."""
OBJECT_STORE_BYTES = 1 << 30
"""The object store of a Ray instance started for the run: a context's rows are kilobytes, and Ray's default (30 % of
the memory) is mapped by every Ray process, which an address-space limit (``ulimit -v``, ``prlimit --as``) refuses:
``ray.init`` then waited for ever, before any worker could be watched (probe 25, #1)."""
RAY_LEAVE_SECONDS = 30.0
"""How long the run waits for Ray to kill its actors and shut down its instance (:func:`_leave_ray`)."""
RAY_LOGS = ("Ray hides its workers' output here: their logs say why one did not start (session_latest/logs in Ray's "
            "temporary folder, /tmp/ray by default, on the node that ran it)")
"""What a worker silent since it started is said with: Ray is told not to copy its workers' output to the run's."""


def in_ray(run: RunPlan, identity: loading.ModelIdentity, jobs: Iterable[ContextJob],
           workers: int) -> Iterator[list[dict]]:
    """The rows of every job from ``workers`` Ray actors (one CPU each), context by context as they finish: on the
    cluster at ``run.address``, or on a Ray instance started here for the run. Each actor answers one job at a time,
    the next taken from ``jobs`` as it becomes free (any ``--n``); an actor silent for
    :func:`~bench.run.worker_watch.silence_limit` seconds is a :class:`~bench.run.stopping.WorkerDied`."""
    import ray

    silence = silence_limit()
    started_here = not ray.is_initialized()
    if started_here:
        _join_ray(ray, run.address)
    actors = []
    try:
        # two calls at once: rows() computes while beat() answers
        remote = ray.remote(num_cpus=1, max_concurrency=2)(_RayWorker)
        actors = [remote.remote(run, identity) for _ in range(workers)]
        names = {actor: f"Ray worker {number} of {workers}" for number, actor in enumerate(actors, 1)}
        clock = WatchClock()  # silence counted only while the driver runs, as for worker processes
        started, heard = clock(), dict.fromkeys(actors)
        beats = {actor.beat.remote(): actor for actor in actors}
        feed, due = iter(jobs), {}
        for actor in actors:
            _give(actor, feed, due)
        while due:
            ready, _ = ray.wait([*due, *beats], num_returns=1, timeout=BEAT_SECONDS)
            for reference in ready:
                if reference in beats:
                    actor = beats.pop(reference)
                    names[actor] = f"Ray worker process {_answer(ray, reference, names[actor])}"
                    heard[actor] = clock()
                else:
                    actor = due.pop(reference)
                    rows = _answer(ray, reference, names[actor])
                    _give(actor, feed, due)
                    yield rows
            now = clock()
            for actor in actors:  # the next beat of each actor heard a beat ago
                if actor not in beats.values() and now - heard[actor] >= BEAT_SECONDS:
                    beats[actor.beat.remote()] = actor
            raise_if_silent(names, heard, started, silence, now, starting=RAY_LOGS)
    except ray.exceptions.RayError as error:
        raise _worker_error(error) from None
    finally:
        _leave_ray(ray, actors, started_here)


def _leave_ray(ray, actors: list, started_here: bool, timeout: float = RAY_LEAVE_SECONDS) -> None:
    """Kill ``actors`` (a stopped one too, with SIGKILL: it would hold its core and model) and shut down the Ray
    instance ``started_here``, within ``timeout`` seconds: both wait on the cluster's GCS, which a stopped or lost
    head never answers (probe 28, #1: every row written, then the run waited for ever). Past the bound the run goes
    on with one line said; the processes of an instance started here are killed, and Ray's own shutdown at exit,
    which would wait so too, is called off."""
    def leave() -> None:
        for actor in actors:
            ray.kill(actor)
        if started_here:
            ray.shutdown()

    thread = threading.Thread(target=leave, name="ray-leave", daemon=True)
    thread.start()
    thread.join(timeout)
    if not thread.is_alive():
        return
    atexit.unregister(ray.shutdown)
    node = getattr(getattr(getattr(ray, "_private", None), "worker", None), "_global_node", None)
    if started_here and node is not None:  # the instance's own processes: they answer no one now
        node.kill_all_processes(check_alive=False, allow_graceful=False)
    left = ("its processes were killed (its agents end by themselves within minutes)" if started_here else
            "the cluster keeps the actors until it answers again")
    print(f"\nnote: Ray did not let go of the run's workers within {timeout:g} s (its head, GCS or raylet, does not "
          f"answer): what was finished is kept; {left}", file=sys.stderr)  # on a line of its own, after the bar


def _answer(ray, reference, name: str):
    """``ray.get(reference)``, the call of the actor ``name``; a :class:`~bench.run.stopping.WorkerDied` naming it
    where its process died (killed, as the out-of-memory killer does, or its node lost) rather than Ray's traceback
    (probe 25, #2), as a worker process's death is said."""
    try:
        return ray.get(reference)
    except ray.exceptions.RayActorError as error:
        if _worker_error(error) is not error:  # the actor's own exception, raised by its build or its job
            raise
        raise WorkerDied(f"{name} died before the run finished (killed, as the out-of-memory killer does, or its "
                         "node was lost; Ray's logs say which)") from None


def _give(actor, feed: Iterator[ContextJob], due: dict) -> None:
    """Have ``actor`` answer the next job of ``feed``, if any (``due``: each call's reference, to its actor)."""
    job = next(feed, None)
    if job is not None:
        due[actor.rows.remote(job)] = actor


class _RayWorker:
    """A :class:`ContextWorker` as a Ray actor, built by its first :meth:`rows` call, not by its constructor: its
    :meth:`beat` answers while the model loads (a worker process beats while it loads so too), and a build's error
    reaches the driver whole (Ray hands a method's exception back as it was raised, ``RayTaskError.cause``, a
    constructor's only as text)."""

    def __init__(self, run: RunPlan, identity: loading.ModelIdentity):
        self.run, self.identity, self.worker = run, identity, None

    def beat(self) -> int:
        """That it is there, whatever :meth:`rows` is doing: its process id, which names it."""
        return os.getpid()

    def rows(self, job: ContextJob) -> list[dict]:
        if self.worker is None:  # one job at a time an actor: no other call builds it meanwhile
            self.worker = ContextWorker(self.run, self.identity)
        return self.worker.rows(job)


def _worker_error(error: BaseException) -> BaseException:
    """The exception an actor raised, as it was raised there (a worker process's is re-raised so too), out of the
    ``RayTaskError`` Ray wraps it in; Ray's own error where no exception of the worker's is inside."""
    cause = error
    while getattr(cause, "cause", None) is not None and cause.cause is not cause:
        cause = cause.cause
    return cause if isinstance(cause, Exception) and not type(cause).__module__.startswith("ray.") else error


def _join_ray(ray, address: str | None, timeout: float = RAY_CONNECT_SECONDS) -> None:
    """``ray.init`` at ``address`` (None: ``RAY_ADDRESS``'s, as Ray reads it, else none). A cluster started here (none,
    or ``local``) starts in this thread, as Ray expects of a local start (the processes it starts die with the thread
    that started them), with an object store of :data:`OBJECT_STORE_BYTES` (probe 26, #1: ``local`` had Ray's
    default). Joining a running one is bounded by ``timeout`` seconds: that call runs in a daemon thread, which does
    not keep the process if it never returns."""
    joined = address if address is not None else os.environ.get(RAY_ADDRESS_ENV) or None
    if joined in (None, "local"):
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     object_store_memory=OBJECT_STORE_BYTES)
        except Exception as error:  # noqa: BLE001 - Ray raises a bare Exception when its node does not come up
            reason = " ".join(str(error).split()) or type(error).__name__
            raise UsageError(f"the Ray instance started for the run did not come up ({type(error).__name__}: "
                             f"{reason}); its logs say why (session_latest/logs in Ray's temporary folder, /tmp/ray "
                             "by default); what it started ends by itself within minutes") from None
        return
    failure: list[BaseException] = []

    def join() -> None:
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread
            failure.append(error)

    thread = threading.Thread(target=join, name="ray-init", daemon=True)
    thread.start()
    thread.join(timeout)
    given = f"--address {address}" if address is not None else f"{RAY_ADDRESS_ENV}={joined}"
    if thread.is_alive():
        raise UsageError(f"{given}: no Ray cluster joined within {timeout:g} s (something answers there, "
                         "but ray.init keeps retrying); give the head node's GCS address (HOST:PORT, port 6379 by "
                         "default)")
    if failure and isinstance(failure[0], (ValueError, ConnectionError)):  # Ray's refusal of the address or cluster
        reason = " ".join(str(failure[0]).split()) or type(failure[0]).__name__
        raise UsageError(f"{given}: Ray could not join a cluster there ({type(failure[0]).__name__}: {reason}); give "
                         "the head node's GCS address (HOST:PORT, port 6379 by default)") from None
    if failure:
        raise failure[0]

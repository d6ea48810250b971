"""What a comparison is asked to run, as given: :class:`CompareSettings` names the presses, allocators, kept
fractions, tasks and engine of one ``bench compare``; :func:`bench.run.plan.plan` checks them all and resolves them
once into the frozen :class:`~bench.run.plan.RunPlan` that everything after reads.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from pretrained import loading
from runtime.errors import UsageError
from workloads.tasks.ruler import GENERATED, TASKS

KEEP_FRACTION_GRIDS = {
    "default": (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
    "paper": (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
}
"""Named kept-fraction grids: ``default`` adds 0.02 and 0.05, where eviction bites, to the paper's grid."""
DEFAULT_KEEP_FRACTIONS = KEEP_FRACTION_GRIDS["default"]
MIN_LENGTH = 64
EXECUTORS = ("local", "ray")
"""``local``: this process or ``--jobs`` worker processes; ``ray``: ``--jobs`` Ray actors
(:mod:`bench.run.execution`)."""
RAY_ANSWER_SECONDS = 5.0
"""How long a Ray cluster's address has to accept a connection and answer as a gRPC server (:func:`check_ray_address`):
``ray.init`` itself retries an address that does not answer for minutes."""
RAY_ADDRESS_ENV = "RAY_ADDRESS"
"""Where ``ray.init`` looks for a cluster's address when none is given: checked as ``--address`` is."""
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""What an HTTP/2 client sends first (RFC 9113 §3.4), with an empty SETTINGS frame; a gRPC server such as Ray's GCS
or its client server answers with a SETTINGS frame of its own (frame type 4)."""


@dataclass
class CompareSettings:
    """One comparison: every (press, allocator, kept fraction) on every context of the tasks.

    Attributes
    ----------
    presses, allocators : list[str]
        Registry names (``presses.available()``, ``allocators.available()``), each with its own options if any:
        ``snapkv[window=64]`` (:mod:`bench.run.specs`); ``none`` (no prune) always runs.
    keep_fractions : list[float]
        Kept fractions p in (0, 1] (``--keep-fractions``; kvpress's compression ratio 1 − p, ``--compression-ratios``,
        is converted at the CLI).
    tasks : list[str]
        Task names or groups (:data:`workloads.tasks.registry.GROUPS`).
    n : int
        Contexts per task.
    length : int
        Context length in tokens.
    model : str or ModelSpec or ModelInfo, optional
        A model directory or hub id, with device and dtype, or a model read already
        (:func:`pretrained.model_info.read`, as ``bench compare`` reads it once); default: the shipped model.
    jobs : int
        Worker processes, one context each.
    batch : int
        Compacted children answered as one padded batch.
    press_options, alloc_options : dict
        Field values of every press / allocator of the run (typed by :func:`bench.run.plan.plan`; a press without
        one of them is refused), besides those in its brackets.
    engine : str
        One of :data:`bench.store.row_fields.ENGINES`.
    haystack : str
        ``generated`` or a real-text source for the tasks that read one.
    shard : tuple[int, int], optional
        ``(k, n)``: run only the contexts whose position in the run's list is k modulo n (``--shard k/n``), for
        batch schedulers; ``bench merge`` joins the shards' stores.
    executor : str
        Where the contexts run: ``local`` (this process, or ``jobs`` worker processes) or ``ray`` (``jobs`` Ray
        actors on the cluster at ``address``, or a local Ray instance).
    address : str, optional
        The Ray cluster's address (``ray`` executor).
    pairs : list[str]
        ``press/allocator`` pairs to run instead of every press with every allocator (``--methods``), each part
        with its own options if any (``snapkv[window=64]/flat``); the presses and allocators are then the pairs'.
    imports : list[str]
        The modules the caller imported to register its presses or allocators (``--import``), imported as named by
        each worker process before it builds the run's methods: a press's class may name another module (one made
        with ``type()`` over an ABC names ``abc``), and its own module alone would leave it unregistered there.
    """

    presses: list[str]
    allocators: list[str] = field(default_factory=lambda: ["flat"])
    keep_fractions: list[float] = field(default_factory=lambda: list(DEFAULT_KEEP_FRACTIONS))
    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    n: int = 2
    length: int = 1024
    model: str | loading.ModelSpec | loading.ModelInfo | None = None
    seed: int = 0
    out: Path = Path("results")
    profile: str = "compact"
    scbench_data: Path | None = None
    jobs: int = 1
    batch: int = 32
    press_options: dict = field(default_factory=dict)
    alloc_options: dict = field(default_factory=dict)
    engine: str = "hf"
    haystack: str = GENERATED
    pairs: list[str] = field(default_factory=list)
    shard: tuple[int, int] | None = None
    executor: str = "local"
    address: str | None = None
    imports: list[str] = field(default_factory=list)


def check_ray_address(address: str, timeout: float = RAY_ANSWER_SECONDS, given: str = "--address") -> None:
    """``UsageError`` unless a gRPC server (a Ray cluster's GCS) answers at ``address`` within ``timeout`` seconds in
    all: a typo in the address fails here at once, where ``ray.init`` would retry it for minutes. ``auto`` and
    ``local`` are Ray's own to resolve (it answers them at once). ``ray://`` (Ray's client, deprecated by Ray and
    not in the ``ray`` extra) is refused: the run's actors join the cluster itself (probe 27, #1).

    Parameters
    ----------
    address : str
        ``HOST:PORT``, ``auto`` or ``local`` (``ray.init``'s ``address``).
    timeout : float
        Seconds to connect and to read the server's first frame, together.
    given : str
        Where the address came from, as the message names it: ``--address``, or :data:`RAY_ADDRESS_ENV` (where
        ``ray.init`` reads one when ``--address`` is left out).
    """
    if address in ("auto", "local"):
        return
    shown = f"--address {address}" if given == "--address" else f"{given}={address}"
    without = "leave --address out" if given == "--address" else f"unset {given}"
    if address.startswith("ray://"):
        raise UsageError(f"{shown}: ray:// is Ray's client, which the bench does not run through; give the head "
                         "node's GCS address (HOST:PORT, port 6379 by default)")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{shown}: expected HOST:PORT (a Ray cluster's head, e.g. 10.0.0.1:6379; a port in "
                         "1 … 65535), auto or local")
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as connection:
            connection.settimeout(max(deadline - time.monotonic(), 0.01))
            connection.sendall(HTTP2_PREFACE)
            frame = connection.recv(9)
    except (OSError, UnicodeError) as error:  # refused, unreachable, unknown or malformed host, or no answer in time
        reason = "no answer" if isinstance(error, TimeoutError) else getattr(error, "strerror", None) or str(error)
        raise UsageError(f"{shown}: no Ray cluster answers there within {timeout:g} s ({reason}); check the head "
                         f"node's address and port, or {without} to start Ray for the run") from None
    if len(frame) < 4 or frame[3] != 4:
        raise UsageError(f"{shown}: something answers there, but not a Ray cluster (no gRPC reply within "
                         f"{timeout:g} s); check the head node's address and port")

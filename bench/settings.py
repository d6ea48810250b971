"""What a comparison runs, and every error knowable before the model loads.

:class:`CompareSettings` names the presses, allocators, kept fractions, tasks and engine of one ``bench compare``;
:func:`validate` checks them all (the press and allocator options typed by their fields) and raises one clear
:class:`~runtime.errors.UsageError` naming the bad value and what is allowed.
"""

from __future__ import annotations

import importlib.util
import socket
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import allocators
import presses
from artifacts.outputs import Output, check
from presses.selection import check_pair
from pretrained import loading
from runtime.errors import UsageError
from workloads.tasks import registry as tasks
from workloads.tasks.ruler import GENERATED, TASKS

from .store import BASELINE, code_version

KEEP_FRACTION_GRIDS = {
    "default": (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
    "paper": (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
}
"""Named kept-fraction grids: ``default`` adds 0.02 and 0.05, where eviction bites, to the paper's grid."""
DEFAULT_KEEP_FRACTIONS = KEEP_FRACTION_GRIDS["default"]
MIN_LENGTH = 64
EXECUTORS = ("local", "ray")
"""``local``: this process or ``--jobs`` worker processes; ``ray``: ``--jobs`` Ray actors (:mod:`bench.execution`)."""
ENGINES = ("hf", "vllm")
"""``hf``: this project's runtime on a transformers model; ``vllm``: compaction inside vLLM (:mod:`serving`)."""
RAY_ANSWER_SECONDS = 5.0
"""How long a Ray cluster's address has to accept a connection and answer as a gRPC server (:func:`check_ray_address`):
``ray.init`` itself retries an address that does not answer for minutes."""
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""What an HTTP/2 client sends first (RFC 9113 §3.4), with an empty SETTINGS frame; a gRPC server such as Ray's GCS
or its client server answers with a SETTINGS frame of its own (frame type 4)."""


@dataclass
class CompareSettings:
    """One comparison: every (press, allocator, kept fraction) on every context of the tasks.

    Attributes
    ----------
    presses, allocators : list[str]
        Registry names (``presses.available()``, ``allocators.available()``); ``none`` (no prune) always runs.
    keep_fractions : list[float]
        Kept fractions p in (0, 1] (``--keep-fractions``, alias ``--ratios``; kvpress's compression ratio 1 − p
        is converted at the CLI).
    tasks : list[str]
        Task names or groups (:data:`workloads.tasks.registry.GROUPS`).
    n : int
        Contexts per task.
    length : int
        Context length in tokens.
    model : str or ModelSpec, optional
        A model directory or hub id, with device and dtype; default: the shipped model.
    jobs : int
        Worker processes, one context each.
    batch : int
        Compacted children answered as one padded batch.
    press_options, alloc_options : dict
        Field values of every press / allocator of the run (typed by :func:`validate`).
    engine : str
        One of :data:`ENGINES`.
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
        ``press/allocator`` pairs to run instead of every press with every allocator (``--methods``); the
        presses and allocators are then those of the pairs.
    """

    presses: list[str]
    allocators: list[str] = field(default_factory=lambda: ["flat"])
    keep_fractions: list[float] = field(default_factory=lambda: list(DEFAULT_KEEP_FRACTIONS))
    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    n: int = 2
    length: int = 1024
    model: str | loading.ModelSpec | None = None
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

    def combinations(self) -> list[tuple[str, str]]:
        """``(press, allocator)`` registry names of every compacted child, in order."""
        if self.pairs:
            return [tuple(pair.split("/", 1)) for pair in self.pairs]
        return [(p, a) for p in self.presses if p != BASELINE for a in self.allocators]

    def press_label(self, name: str) -> str:
        """The press's name in rows: with its options, if any, so that differently configured runs never mix."""
        return _label(name, self.press_options)

    def alloc_label(self, name: str) -> str:
        return _label(name, self.alloc_options)

    def methods(self) -> list[tuple[str, str, float]]:
        """``(press label, allocator label, kept fraction)`` of every child of a context, no prune first."""
        return [(BASELINE, BASELINE, 1.0)] + [(self.press_label(p), self.alloc_label(a), r)
                                              for p, a in self.combinations() for r in self.keep_fractions]


def _label(name: str, options: dict) -> str:
    if not options:
        return name
    # lists with ';' so that a method name "press/allocator" keeps exactly one '/'
    shown = ",".join(f"{k}={';'.join(f'{x:g}' for x in v) if isinstance(v, list) else v}"
                     for k, v in sorted(options.items()))
    return f"{name}({shown})"


def _nonempty(values: list, what: str, allowed: str) -> None:
    if not values:
        raise UsageError(f"{what} is empty; give at least one of: {allowed}")


def _positive_int(value, what: str, meaning: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{what} must be an integer >= 1 ({meaning}), got {value!r}")


@dataclass
class CheckedSettings(CompareSettings):
    """Settings that passed :func:`validate`: the presses and allocators those of the pairs (``--methods``), the
    press and allocator options typed by their fields (what rows record), and ``code``, the code version
    (:func:`bench.store.code_version`) the run's rows carry, fixed once when the settings are checked: a source
    edited while a long run goes on changes neither the rows' version nor which rows its summary reads."""

    code: str = ""


def _pairs(settings: CompareSettings) -> tuple[list[str], list[str]]:
    """``--methods``: each a ``press/allocator`` pair, none twice; returns the pairs' presses and allocators."""
    for pair in settings.pairs:
        press, sep, allocator = pair.partition("/")
        if not sep or not press or not allocator or "/" in allocator:
            raise UsageError(f"--methods {pair!r}: expected press/allocator, e.g. gatesight/gate")
        if press == BASELINE:
            raise UsageError(f"--methods {pair!r}: no prune ({BASELINE}) always runs; name compacting methods only")
    if len(set(settings.pairs)) < len(settings.pairs):
        twice = next(p for p in settings.pairs if settings.pairs.count(p) > 1)
        raise UsageError(f"--methods names {twice!r} twice")
    return (list(dict.fromkeys(pair.split("/", 1)[0] for pair in settings.pairs)),
            list(dict.fromkeys(pair.split("/", 1)[1] for pair in settings.pairs)))


def validate(settings: CompareSettings) -> CheckedSettings:
    """Every error that can be known before the model loads, as one clear ``UsageError``; returns the settings
    checked (:class:`CheckedSettings`: the press and allocator options typed, what rows record). ``settings`` is
    not changed."""
    code = settings.code if isinstance(settings, CheckedSettings) else ""
    settings = CheckedSettings(**{f.name: getattr(settings, f.name) for f in fields(CompareSettings)})
    if settings.pairs:
        settings.presses, settings.allocators = _pairs(settings)
    _nonempty(settings.presses, "--press", ", ".join(presses.available() + [BASELINE]))
    _nonempty(settings.allocators, "--alloc", ", ".join(allocators.available()))
    _nonempty(settings.keep_fractions, "--keep-fractions",
              "kept fractions in (0, 1], or a grid name: " + ", ".join(KEEP_FRACTION_GRIDS))
    _nonempty(settings.tasks, "--tasks", f"task names or the groups {', '.join(tasks.GROUPS)}")
    if settings.engine == "vllm":  # first: what the engine cannot run (kvpress presses) is refused with its reason
        _validate_served(settings)
    # unknown names, ill-typed options and unbuildable presses fail here, with the valid choices; the options
    # are then held typed by their fields, so that rows name what ran (normalized_anchor=no runs and reads False)
    for name in settings.presses:
        if name != BASELINE:
            settings.press_options = presses.options_of(name, settings.press_options)
    for name in settings.allocators:
        settings.alloc_options = allocators.options_of(name, settings.alloc_options)
    for press, allocator in settings.combinations():  # e.g. the global allocator with a press of no one scale
        check_pair(presses.get(press, **settings.press_options), allocators.get(allocator, **settings.alloc_options))
    layers = loading.attention_layer_count(settings.model)
    if layers is not None:
        for name in settings.allocators:
            allocators.get(name, **settings.alloc_options).check_layers(layers)
    tasks.check(settings.tasks, settings.profile, settings.haystack, settings.scbench_data)
    for fraction in settings.keep_fractions:
        allocators.check_keep_fraction(fraction, "keep fraction")
    _positive_int(settings.jobs, "jobs", "worker processes")
    _positive_int(settings.batch, "batch", "children answered together")
    if settings.n < 1:
        raise UsageError(f"n must be >= 1 (items per task), got {settings.n}")
    if settings.length < MIN_LENGTH:
        raise UsageError(f"length {settings.length} is too short; use at least {MIN_LENGTH} tokens")
    limit = loading.position_limit(settings.model)
    if limit is not None and settings.length > limit:  # the length holds the answer: items are fitted to it
        raise UsageError(f"length {settings.length} is longer than the model's position limit "
                         f"(max_position_embeddings = {limit}): a context, its question and the answer budget "
                         f"(max new tokens) together take --length positions; give --length <= {limit}")
    if settings.shard is not None:
        k, n = settings.shard
        if isinstance(k, bool) or not isinstance(k, int) or not isinstance(n, int) or not 0 <= k < n:
            raise UsageError(f"shard {k}/{n}: expected k/n with 0 <= k < n")
    if settings.executor not in EXECUTORS:
        raise UsageError(f"unknown executor {settings.executor!r}; choose from {', '.join(EXECUTORS)}")
    if settings.executor == "ray":
        if importlib.util.find_spec("ray") is None:
            raise UsageError("--executor ray needs Ray: pip install -e '.[ray]'")
        if settings.engine != "hf":
            raise UsageError("--executor ray runs this project's runtime (--engine hf); the vLLM engine runs in one "
                             "process")
        if settings.address is not None:
            check_ray_address(settings.address)
    elif settings.address is not None:
        raise UsageError("--address is the Ray cluster's: it needs --executor ray")
    if settings.engine not in ENGINES:
        raise UsageError(f"unknown engine {settings.engine!r}; choose from {', '.join(ENGINES)}")
    if settings.scbench_data is not None and not Path(settings.scbench_data).exists():
        raise UsageError(f"--scbench-data {settings.scbench_data}: no such file or directory (a local copy of "
                         "microsoft/SCBench)")
    check([Output(Path(settings.out), "--out")])
    settings.code = code or code_version(settings.engine)
    return settings


def check_ray_address(address: str, timeout: float = RAY_ANSWER_SECONDS) -> None:
    """``ValueError`` unless a gRPC server (a Ray cluster's GCS, or its client server for ``ray://``) answers at
    ``address`` within ``timeout`` seconds in all: a typo in the address fails here at once, where ``ray.init``
    would retry it for minutes. ``auto`` and ``local`` are Ray's own to resolve (it answers them at once).

    Parameters
    ----------
    address : str
        ``HOST:PORT``, ``ray://HOST:PORT``, ``auto`` or ``local`` (``ray.init``'s ``address``).
    timeout : float
        Seconds to connect and to read the server's first frame, together.
    """
    if address in ("auto", "local"):
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--address {address!r}: expected HOST:PORT (a Ray cluster's head, e.g. 10.0.0.1:6379; a "
                         "port in 1 … 65535), ray://HOST:PORT, auto or local")
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as connection:
            connection.settimeout(max(deadline - time.monotonic(), 0.01))
            connection.sendall(HTTP2_PREFACE)
            frame = connection.recv(9)
    except (OSError, UnicodeError) as error:  # refused, unreachable, unknown or malformed host, or no answer in time
        reason = "no answer" if isinstance(error, TimeoutError) else getattr(error, "strerror", None) or str(error)
        raise UsageError(f"--address {address}: no Ray cluster answers there within {timeout:g} s ({reason}); "
                         "check the head node's address and port, or leave --address out to start Ray for the run") \
            from None
    if len(frame) < 4 or frame[3] != 4:
        raise UsageError(f"--address {address}: something answers there, but not a Ray cluster (no gRPC reply within "
                         f"{timeout:g} s); check the head node's address and port")


def _validate_served(settings: CompareSettings) -> None:
    """What the vLLM engine runs is the serving plugin's to say (:func:`serving.check_request`); the bench asks."""
    if importlib.util.find_spec("vllm") is None:
        raise UsageError("--engine vllm needs vLLM, which lives in its own environment: scripts/serving_env.sh")
    from serving import check_request

    check_request([name for name in settings.presses if name != BASELINE], settings.allocators, settings.jobs,
                  loading.dtype_name(settings.model), loading.resolve(settings.model))

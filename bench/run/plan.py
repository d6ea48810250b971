"""A comparison resolved once: :func:`plan` turns :class:`~bench.run.settings.CompareSettings` into a frozen
:class:`RunPlan`, raising every error knowable before the model loads as one clear
:class:`~runtime.errors.UsageError` naming the bad value and what is allowed.

Everything after reads the plan: its methods are :class:`~bench.run.specs.Method` specs (press and allocator, each with
its own options, typed by their fields) whose labels are what rows record; nothing parses a label back.
"""

from __future__ import annotations

import importlib.util
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import allocators
import presses
from artifacts.output_kinds import RESULT_STORE
from artifacts.outputs import Output, check
from presses.preparation import REFUSALS, press_call
from presses.selection import check_pair
from pretrained import loading
from pretrained.cache_guard import check_outside_the_cache
from pretrained.model_info import ModelInfo, read
from pretrained.model_spec import ModelSpec
from runtime.errors import UsageError, describe
from runtime.user_code import UserCodeError, run_users
from workloads.tasks import registry as tasks
from workloads.tasks.scbench import load_rows

from ..store.code_version import code_version, method_codes
from ..store.row_fields import BASELINE, BASELINE_CODE, ENGINES, check_items, shown_fraction
from .methods import check_nonempty, methods_of, registry_names
from .settings import (
    EXECUTORS,
    KEEP_FRACTION_GRIDS,
    MIN_LENGTH,
    RAY_ADDRESS_ENV,
    CompareSettings,
    check_ray_address,
)
from .specs import (
    BASELINE_METHOD,
    AllocatorSpec,
    Method,
    PressSpec,
)


@dataclass(frozen=True)
class RunPlan:
    """One comparison, checked: what runs, on what, where. Built by :func:`plan` only.

    Attributes
    ----------
    methods : tuple[Method, ...]
        The compacting methods, in order (no prune always runs besides: :attr:`children`).
    keep_fractions : tuple[float, ...]
    tasks : tuple[str, ...]
        Task names, groups expanded, in order.
    model : ModelInfo
        The model read once (:func:`pretrained.model_info.read`): its directory, config and fingerprints, handed to
        what loads it and to the presses that read its artifacts; a worker receives it with the plan.
        :attr:`model_dir` is its directory (absolute: rows record its name, and `.` has none), :attr:`dtype` and
        :attr:`device` what rows record of it.
    code : str
        The shared code version (:func:`bench.store.code_version.code_version`) the run's rows carry, fixed once when
        planned: a source edited while a long run goes on changes neither the rows' version nor which rows its
        summary reads.
    modules : tuple[str, ...]
        The modules outside the project that define a press or allocator of the run (a user's own, registered when
        imported): a worker process imports them before it builds the run's methods.
    method_codes : Mapping[str, str]
        ``{method label: its own code}`` (:func:`bench.store.code_version.method_codes`; ``none`` for no prune), fixed
        once when planned as ``code`` is.
    shard : tuple[int, int] or None
        ``(k, n)``: the contexts at positions k, k + n, ... of the run (``--shard k/n``).
    The other fields are those of :class:`~bench.run.settings.CompareSettings`.
    """

    methods: tuple[Method, ...]
    keep_fractions: tuple[float, ...]
    tasks: tuple[str, ...]
    n: int
    length: int
    profile: str
    seed: int
    haystack: str
    scbench_data: Path | None
    model: ModelInfo
    engine: str
    code: str
    method_codes: Mapping[str, str]
    modules: tuple[str, ...]
    out: Path
    jobs: int
    batch: int
    shard: tuple[int, int] | None
    executor: str
    address: str | None

    @property
    def model_dir(self) -> Path:
        return self.model.directory

    @property
    def dtype(self) -> str:
        return self.model.dtype

    @property
    def device(self) -> str:
        return self.model.device

    @cached_property
    def presses(self) -> tuple[PressSpec, ...]:
        """Every press of the methods, once each, in order."""
        return tuple(dict.fromkeys(method.press for method in self.methods))

    @cached_property
    def allocators(self) -> tuple[AllocatorSpec, ...]:
        return tuple(dict.fromkeys(method.allocator for method in self.methods))

    @cached_property
    def children(self) -> tuple[tuple[Method, float], ...]:
        """``(method, kept fraction)`` of every child of a context, no prune (at 1.0) first."""
        return ((BASELINE_METHOD, 1.0),) + tuple((m, p) for m in self.methods for p in self.keep_fractions)

    @cached_property
    def run(self) -> dict:
        """The run its rows name (:data:`bench.store.row_fields.RUN`): tasks, ``n``, haystack, and its shard ``k`` of
        ``N`` (0 of 1 unsharded)."""
        k, count = self.shard or (0, 1)
        return {"tasks": list(self.tasks), "n": self.n, "haystack": self.haystack, "shard": k, "shards": count}


def _positive_int(value, what: str, meaning: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise UsageError(f"{what} must be an integer >= 1 ({meaning}), got {value!r}")


def _check_served(settings: CompareSettings, model: ModelInfo) -> None:
    """What the vLLM engine runs is the serving plugin's to say (:func:`serving.check_request`); the bench asks."""
    if importlib.util.find_spec("vllm") is None:
        raise UsageError("--engine vllm needs vLLM, which lives in its own environment: scripts/serving_env.sh")
    from serving import check_request

    check_request(*registry_names(settings), settings.jobs, model.dtype, model.directory)


def _check_served_options(methods: tuple[Method, ...]) -> None:
    """The engine records one prefill's evidence for every press with one option set (``CompactingLLM.hold``)."""
    press_specs = list(dict.fromkeys(m.press for m in methods))
    if len({p.options for p in press_specs}) > 1:
        raise UsageError(f"--engine vllm: the presses {', '.join(p.label for p in press_specs)} have different "
                         "options; the engine prefills a context once with one option set for every press: give "
                         "them the same options, or run them apart")


def _check_types(settings: CompareSettings) -> None:
    """What a library caller gives in the wrong type, refused first naming the field (a string where a list belongs
    would otherwise be read as its characters)."""
    lists = {"presses": "snapkv", "allocators": "flat", "tasks": "niah_single_1", "pairs": "snapkv/flat",
             "keep_fractions": 0.5, "imports": "my_press"}
    for name, example in lists.items():
        value = getattr(settings, name)
        if not isinstance(value, (list, tuple)):
            kind = "numbers" if name == "keep_fractions" else "names"
            raise UsageError(f"{name} must be a list of {kind}, e.g. [{example!r}], got {value!r}")
        others = [item for item in value if not isinstance(item, str)]
        if name != "keep_fractions" and others:
            raise UsageError(f"{name} must hold names (text), e.g. [{example!r}], got {others[0]!r} in "
                             f"{list(value)!r}")
    for fraction in settings.keep_fractions:
        if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real):
            raise UsageError(f"keep_fractions must hold numbers in (0, 1], got {fraction!r} in "
                             f"{list(settings.keep_fractions)!r}")
    for name in ("n", "length", "seed"):
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise UsageError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if settings.seed < 0:  # as the CLI's --seed (bench.commands.arguments.natural)
        raise UsageError(f"seed must be an integer >= 0, got {settings.seed!r}")
    if settings.model is not None and not isinstance(settings.model, (str, Path, ModelSpec, ModelInfo)):
        raise UsageError(f"model must be a model directory or hub id (str or Path), a pretrained.loading.ModelSpec, "
                         f"a pretrained.model_info.ModelInfo or None (the shipped model), got "
                         f"{describe(settings.model)}")
    shard = settings.shard
    if shard is not None and not (isinstance(shard, (tuple, list)) and len(shard) == 2 and all(
            isinstance(part, numbers.Integral) and not isinstance(part, bool) for part in shard)
            and 0 <= shard[0] < shard[1]):
        raise UsageError(f"shard must be a (k, n) tuple of integers with 0 <= k < n, e.g. (0, 2), got {shard!r}")
    if not isinstance(settings.out, (str, os.PathLike)):
        raise UsageError(f"out must be a directory path (str or Path), got {describe(settings.out)}")
    if not str(settings.out).strip():
        raise UsageError(f"out={str(settings.out)!r} is empty ('' would mean the current folder): give the directory "
                         "the results go to")
    for name, example in {"press_options": {"window": 64}, "alloc_options": {"weights": [1, 2]}}.items():
        value = getattr(settings, name)
        if not isinstance(value, Mapping):  # 'window=64' is the CLI's form (--press-options), not the library's
            raise UsageError(f"{name} must be a dict of option values by name, e.g. {example!r}, got {value!r}")
        keys = [key for key in value if not isinstance(key, str)]
        if keys:
            raise UsageError(f"{name} must name each option by text, e.g. {example!r}, got the key {keys[0]!r}")
    if settings.scbench_data is not None and not isinstance(settings.scbench_data, (str, os.PathLike)):
        raise UsageError(f"scbench_data must be a directory path (str or Path) or None, got "
                         f"{describe(settings.scbench_data)}")


def plan(settings: CompareSettings | RunPlan) -> RunPlan:
    """The :class:`RunPlan` of ``settings``, every error knowable before the model loads raised first; a plan is
    returned as it is (its code version kept)."""
    if isinstance(settings, RunPlan):
        return settings
    _check_types(settings)
    model = read(settings.model)  # its directory and config, read once for the whole run
    if settings.engine == "vllm":  # first: what the engine cannot run (kvpress presses) is refused with its reason
        _check_served(settings, model)
    methods = methods_of(settings, model)
    if settings.engine == "vllm":
        _check_served_options(methods)
    check_nonempty(settings.keep_fractions, "--keep-fractions",
              "kept fractions in (0, 1], or a grid name: " + ", ".join(KEEP_FRACTION_GRIDS))
    check_nonempty(settings.tasks, "--tasks", f"task names or the groups {', '.join(tasks.GROUPS)}")
    built = {spec: allocators.get(spec.name, **spec.kwargs) for spec in dict.fromkeys(m.allocator for m in methods)}
    # e.g. the global allocator with a press of no one scale; each press built once here
    press_built = {spec: presses.get(spec.name, **spec.kwargs) for spec in dict.fromkeys(m.press for m in methods)}
    if press_built:
        loading.check_artifacts(model.directory)  # a damaged artifact named by its file, before a press reads it
    for press in press_built.values():  # what each reads (an estimator of other weights is refused), and whether
        _bind(press, model)              # GateSight's scores share one scale, is its artifacts' to say
    for method in methods:
        check_pair(press_built[method.press], built[method.allocator])
    if model.attention_layers is not None:
        for spec, allocator in built.items():  # a ValueError is its refusal, said as a bad option
            run_users(allocator.check_layers, type(allocator), f"allocator {spec.name}", "in check_layers",
                      len(model.attention_layers), passing=(ValueError,))
    tasks.check(settings.tasks, settings.profile, settings.haystack, settings.scbench_data)
    # numpy's numbers as Python's: rows are written as JSON
    keep_fractions = tuple(allocators.check_keep_fraction(fraction, "keep fraction") for fraction in
                           settings.keep_fractions)
    n, length, seed = int(settings.n), int(settings.length), int(settings.seed)
    shard = None if settings.shard is None else tuple(int(part) for part in settings.shard)
    shown = [shown_fraction(fraction) for fraction in keep_fractions]
    twice = next((text for text in shown if shown.count(text) > 1), None)
    if twice is not None:
        given = ", ".join(repr(f) for f, text in zip(settings.keep_fractions, shown) if text == twice)
        raise UsageError(f"kept fractions {given} are one fraction where reports show them (p = {twice}); give "
                         "each once, distinct at 6 significant digits")
    _positive_int(settings.jobs, "jobs", "worker processes")
    _positive_int(settings.batch, "batch", "children answered together")
    check_items(settings.n, "n")
    if settings.length < MIN_LENGTH:
        raise UsageError(f"length {settings.length} is too short; use at least {MIN_LENGTH} tokens")
    limit = model.position_limit
    if limit is not None and settings.length > limit:  # the length holds the answer: items are fitted to it
        raise UsageError(f"length {settings.length} is longer than the model's position limit "
                         f"(max_position_embeddings = {limit}): a context, its question and the answer budget "
                         f"(max new tokens) together take --length positions; give --length <= {limit}")
    _check_executor(settings)
    if settings.scbench_data is not None and not Path(settings.scbench_data).is_dir():
        what = "is a file, not a folder" if Path(settings.scbench_data).exists() else "no such folder"
        raise UsageError(f"--scbench-data {settings.scbench_data}: {what} (give the folder of a local copy of "
                         "microsoft/SCBench: its scbench_<task>.jsonl files or a datasets cache)")
    _check_scbench_rows(tasks.expand(settings.tasks), settings.n, settings.scbench_data)
    # the CLI checked --out already; a library caller is named by the argument
    outputs = [Output(Path(settings.out), "out", kind_of=RESULT_STORE)]
    check_outside_the_cache(outputs)  # as the CLI: a library caller too
    check(outputs)
    return RunPlan(
        methods=methods, keep_fractions=keep_fractions, tasks=tuple(tasks.expand(settings.tasks)),
        n=n, length=length, profile=settings.profile, seed=seed, haystack=settings.haystack,
        scbench_data=settings.scbench_data, model=model, engine=settings.engine,
        code=code_version(settings.engine), method_codes={BASELINE: BASELINE_CODE} | dict(zip(
            (m.label for m in methods),
            method_codes([(press_built[m.press], built[m.allocator]) for m in methods], settings.engine,
                         model.directory))),
        modules=_outside_modules(settings.imports, [*press_built.values(), *built.values()]), out=Path(settings.out),
        jobs=int(settings.jobs), batch=int(settings.batch), shard=shard, executor=settings.executor,
        address=settings.address)


def _outside_modules(imports: list[str], objects: list) -> tuple[str, ...]:
    """What a fresh process imports to register a user's presses and allocators: the modules the caller imported
    for them (``imports``, ``--import``: first, in their order), then those of ``objects``' classes that it does not
    import with the project (imported by a script or an installed package's entry point). A worker spawned has the
    driver's ``sys.path`` (``multiprocessing`` hands it over), so it finds them where the driver did."""
    modules = {type(o).__module__ for o in objects}
    outside = sorted(m for m in modules if m != "__main__" and m.partition(".")[0] not in ("presses", "allocators"))
    return tuple(dict.fromkeys([*imports, *outside]))


def _check_scbench_rows(names: list[str], n: int, data) -> None:
    """``UsageError`` where an SCBench task of ``names`` has fewer rows in ``data`` than ``n`` items: a run records
    the n it asks for, and items past the rows are never written, so its store could never be verified."""
    for name in names:
        if name.startswith("scbench_"):
            rows = len(load_rows(name.removeprefix("scbench_"), data))
            if n > rows:
                raise UsageError(f"--n {n}: {name} has {rows} row(s) in {data}; give --n {rows} or fewer (items past "
                                 "the rows are never answered, so the run could never be verified)")


def _bind(press: presses.Press, model: ModelInfo) -> None:
    """``press`` bound to the model as the run will bind it (:func:`presses.preparation.prepare`), so that what is
    checked before the model loads is the estimator the run reads: the model's own where no option names another.
    Its artifacts are small files; the weight files are hashed (an estimator records the weights it was trained on,
    :attr:`~pretrained.model_info.ModelInfo.weights`, kept for the run), not loaded."""
    try:
        press_call(press, "bind", model, passing=REFUSALS)
    except UserCodeError:  # a UsageError, and so a ValueError too: said as it is
        raise
    except REFUSALS as error:
        raise UsageError(f"press {press.name!r} cannot run on {model.directory}: {error}") from None


def _check_executor(settings: CompareSettings) -> None:
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
        elif os.environ.get(RAY_ADDRESS_ENV):  # where ray.init looks then (probe 27, #1: never checked)
            check_ray_address(os.environ[RAY_ADDRESS_ENV], given=RAY_ADDRESS_ENV)
    elif settings.address is not None:
        raise UsageError("--address is the Ray cluster's: it needs --executor ray")
    if settings.engine not in ENGINES:
        raise UsageError(f"unknown engine {settings.engine!r}; choose from {', '.join(ENGINES)}")

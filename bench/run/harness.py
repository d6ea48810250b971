"""The loaded side of a comparison: model, presses, allocators, engine and task builders, built and checked once."""

from __future__ import annotations

import torch

import allocators
from presses.calibration import Calibration, head_shares_for
from presses.context_guard import after_scoring
from presses.preparation import evidence_for, prepare
from pretrained import loading
from runtime import adapter_for, encode_text
from runtime.errors import UsageError
from runtime.model_guard import HeldModel
from runtime.process_guard import threads_left
from runtime.user_code import UserCodeError
from workloads.tasks import registry as tasks
from workloads.tasks.items import Item

from .engine import Engine, RuntimeEngine
from .plan import RunPlan


class Harness:
    """The loaded model of one comparison with its presses, allocators and engine, each built once per process.

    Parameters
    ----------
    run : RunPlan
        What :func:`bench.run.plan.plan` resolved (every pair checked there).
    identity : ModelIdentity
        The model directory's fingerprints (``run.model.identity``), computed once by the caller: what rows record
        of the model.

    Attributes
    ----------
    presses : dict[PressSpec, Press]
        Every press of the run, built with its options, bound to the model's artifacts and checked against it.
    allocators : dict[AllocatorSpec, Allocator]
    engine : Engine
        What contexts run on (:mod:`bench.run.engine`): this project's runtime, or vLLM (``--engine vllm``).
    """

    def __init__(self, run: RunPlan, identity: loading.ModelIdentity):
        self.run, self.identity = run, identity
        self.model, self.tokenizer, self.model_dir = loading.load(run.model)
        loading.check_artifacts(self.model_dir)  # a damaged estimator or calibration is named before any work
        self.adapter = adapter_for(self.model)
        self.presses = {spec: prepare(spec.name, self.adapter, run.model, **spec.kwargs) for spec in run.presses}
        self.allocators = {spec: allocators.get(spec.name, **spec.kwargs) for spec in run.allocators}
        self.engine = self._engine()
        if "artifacts" in run.model.changed():
            # replaced (bench calibrate or train --replace) since the run fingerprinted them: rows would record
            # the old artifacts and hold the new ones' numbers
            raise UsageError(f"{self.model_dir}: its estimator or calibration changed while this run started (a "
                             "`bench calibrate` or `bench train --replace` beside it?); run the command again")
        task_settings = tasks.TaskSettings(run.length, self.encode_list, self.tokenizer.decode, run.profile, run.seed,
                                           run.haystack, run.scbench_data)
        self._builders = {}
        self.held_model = HeldModel(self.model)  # as every context's rows must find it (check_model)
        for task in run.tasks:
            try:  # the first item of every task is built now: a task that cannot fit the length says so at once
                self._builders[task] = tasks.family_of(task).builder(task, task_settings)
                self._builders[task](0)
            except (ValueError, FileNotFoundError, IndexError) as error:
                raise UsageError(f"task {task!r} at --length {run.length}: {error}") from None

    def _engine(self) -> Engine:
        if self.run.engine == "vllm":
            from .served_engine import ServedEngine

            return ServedEngine(self.model_dir, self.run.dtype, self.run.length, self.tokenizer)
        layer_weights = None
        weighted = [spec.name for spec, allocator in self.allocators.items() if allocator.needs_layer_weights]
        if weighted:
            try:  # the gate weights are the model's own, as TriAttention's statistics are
                layer_weights = Calibration.for_model(self.adapter, self.run.model).gate_weights
            except ValueError as error:
                raise UsageError(f"allocator {weighted[0]!r} cannot run on {self.model_dir}: {error}") from None
        if any(allocator.needs_head_shares for allocator in self.allocators.values()):
            # missing, damaged or another model's: refused before any context runs
            head_shares_for(self.adapter, self.run.model)
        return RuntimeEngine(self.model, self.tokenizer, self.presses, self.allocators, layer_weights,
                             evidence_for(self.presses.values(), self.adapter), self.run.batch, self.run.model)

    def check_model(self, scored_by: tuple[str, ...]) -> None:
        """A :class:`~runtime.user_code.UserCodeError` where the model (its hooks, modules, parameters and buffers,
        their values' SHA-256) or the torch functions it runs through changed since the harness was built, naming
        ``scored_by``, the presses that scored the context (labels, in order): the context's rows, made from them,
        are not written."""
        changed = self.held_model.changed()
        if changed:
            raise UserCodeError(f"{changed[0]} changed {after_scoring(scored_by, 'the context')} ({changed[1]}), "
                                f"before its rows were written{threads_left()}: a press reads the context and returns "
                                "scores, and leaves the model and torch as it found them (no hook left, no weight "
                                "changed through .data, no function replaced); the context's rows were not written")

    def encode_list(self, text: str) -> list[int]:
        return encode_text(self.tokenizer, text)

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor(self.encode_list(text), dtype=torch.long)

    def item(self, task: str, index: int) -> Item | None:
        """Item ``index`` of ``task``; None past the last one (an SCBench task with fewer rows than ``--n``)."""
        return self._builders[task](index)

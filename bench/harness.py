"""The loaded side of a comparison: model, presses, allocators, engine and task builders, checked up front."""

from __future__ import annotations

import torch

import allocators
from presses.calibration import Calibration
from presses.preparation import evidence_for, prepare
from presses.selection import check_pair
from pretrained import loading
from runtime import adapter_for, encode_text
from runtime.errors import UsageError
from workloads.tasks import registry as tasks
from workloads.tasks.items import Item

from .settings import CheckedSettings
from .store import BASELINE


class Harness:
    """The loaded model, presses and allocators of one comparison, checked against each other before any work.

    Parameters
    ----------
    settings : CheckedSettings
        What :func:`bench.settings.validate` returned (:func:`bench.compare.run_compare` checks before taking the
        store's lock).

    Attributes
    ----------
    presses : dict[str, Press]
        By the label rows record (:meth:`CompareSettings.press_label`); ``press_names`` maps it to the registry name.
    allocators : dict[str, Allocator]
        By label; ``allocator_names`` maps it to the registry name.
    layer_weights : dict[int, float] or None
        The model's calibrated gate weights, when an allocator reads them.
    evidence : EvidenceRequest
        What the one prefill of a context records for all presses.
    engine : serving.CompactingLLM or None
        The vLLM engine (``--engine vllm``); None: this project's runtime.
    """

    def __init__(self, settings: CheckedSettings):
        self.settings = settings
        self.model, self.tokenizer, self.model_dir = loading.load(settings.model)
        loading.check_artifacts(self.model_dir)  # a damaged estimator or calibration is named before any work
        self.adapter = adapter_for(self.model)
        self.presses, self.press_names = {}, {}
        for name in settings.presses:
            if name != BASELINE:
                label = settings.press_label(name)
                self.presses[label] = prepare(name, self.adapter, self.model_dir, **settings.press_options)
                self.press_names[label] = name
        self.allocators = {settings.alloc_label(name): allocators.get(name, **settings.alloc_options)
                           for name in settings.allocators}
        self.allocator_names = {settings.alloc_label(name): name for name in settings.allocators}
        self.layer_weights = None
        if any(a.needs_layer_weights for a in self.allocators.values()):
            self.layer_weights = Calibration.load(self.model_dir).gate_weights
        for press, allocator in settings.combinations():
            check_pair(self.presses[settings.press_label(press)], self.allocators[settings.alloc_label(allocator)])
        self.evidence = evidence_for(self.presses.values(), self.adapter)
        self.code = settings.code  # fixed when the settings were checked
        self.identity = loading.identity(self.model_dir)
        self.dtype, self.device = loading.dtype_name(settings.model), loading.device_name(settings.model)
        self.engine = self._engine() if settings.engine == "vllm" else None  # reads self.dtype, set just above
        task_settings = tasks.TaskSettings(settings.length, self.encode_list, self.tokenizer.decode,
                                           settings.profile, settings.seed, settings.haystack, settings.scbench_data)
        self._builders = {}
        for task in tasks.expand(settings.tasks):
            try:  # the first item of every task is built now: a task that cannot fit the length says so at once
                self._builders[task] = tasks.family_of(task).builder(task, task_settings)
                self._builders[task](0)
            except (ValueError, FileNotFoundError, IndexError) as error:
                raise UsageError(f"task {task!r} at --length {settings.length}: {error}") from None

    def _engine(self):
        from serving import CompactingLLM

        # each child names its press in compact(); keydiff is only the engine's default. On CPU vLLM checks
        # gpu_memory_utilization of the machine's memory against what is free (the HF copy of the model this harness
        # holds takes some) and the KV pool gets kv_cache_memory_bytes: 1 GiB holds 80K tokens of the 0.8B geometry.
        # max_model_len leaves room for a question (512) and for KVzip's passes after the context (a 2,000-token
        # chunk and its prompt)
        return CompactingLLM(str(self.model_dir), press="keydiff", dtype=self.dtype,
                             max_model_len=self.settings.length + 2560, max_num_seqs=1, gpu_memory_utilization=0.3,
                             kv_cache_memory_bytes=1 << 30)

    def encode_list(self, text: str) -> list[int]:
        return encode_text(self.tokenizer, text)

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor(self.encode_list(text), dtype=torch.long)

    def item(self, task: str, index: int) -> Item | None:
        """Item ``index`` of ``task``; None past the last one (an SCBench task with fewer rows than ``--n``)."""
        return self._builders[task](index)


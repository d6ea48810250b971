"""``bench compare``: every (press, allocator, kept fraction) on the same prefix-only fork protocol.

Per context: one prefill (with the union of the evidence the presses ask for), one scoring per press, one fork
per (allocator, ratio) — only one child alive at a time — and every question of the context answered from it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

import allocators
import presses
from presses.calibration import Calibration
from presses.compress import check_pair, plan_for
from runtime import EvidenceRequest, adapter_for, prefill

from . import models
from .metrics import METRICS
from .store import ResultStore, code_version, row_key
from .tasks import PROFILES, TASKS, Config, generate
from .tasks.scbench import SCBENCH_TASKS, load_rows, to_item

BASELINE = "none"
DEFAULT_RATIOS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
SCBENCH = tuple(f"scbench_{t}" for t in SCBENCH_TASKS)
TASK_GROUPS = {"ruler": TASKS, "niah": tuple(t for t in TASKS if t.startswith("niah")), "scbench": SCBENCH}


@dataclass
class CompareSettings:
    presses: list[str]
    allocators: list[str] = field(default_factory=lambda: ["flat"])
    ratios: list[float] = field(default_factory=lambda: list(DEFAULT_RATIOS))
    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    n: int = 2
    length: int = 1024
    model: str | None = None
    seed: int = 0
    out: Path = Path("results")
    profile: str = "compact"
    scbench_data: Path | None = None


def expand_tasks(names: list[str]) -> list[str]:
    out: list[str] = []
    for name in names:
        for task in TASK_GROUPS.get(name, (name,)):
            if task not in out:
                out.append(task)
    return out


def validate(settings: CompareSettings) -> None:
    """Every error that can be known before any work starts, as one clear ``ValueError``."""
    unknown_press = [p for p in settings.presses if p != BASELINE and p not in presses.PRESSES]
    if unknown_press:
        raise ValueError(f"unknown press {unknown_press[0]!r}; available: {', '.join(presses.available())}, none")
    unknown_alloc = [a for a in settings.allocators if a not in allocators.ALLOCATORS]
    if unknown_alloc:
        raise ValueError(f"unknown allocator {unknown_alloc[0]!r}; available: {', '.join(allocators.available())}")
    unknown_task = [t for t in expand_tasks(settings.tasks) if t not in TASKS + SCBENCH]
    if unknown_task:
        raise ValueError(f"unknown task {unknown_task[0]!r}; available: {', '.join(TASKS + SCBENCH)} "
                         "(or the groups ruler, niah, scbench)")
    if any(t in SCBENCH for t in expand_tasks(settings.tasks)) and settings.scbench_data is None:
        raise ValueError("SCBench tasks read a local copy of microsoft/SCBench: pass --scbench-data DIR")
    bad_ratio = [r for r in settings.ratios if not 0 < r <= 1]
    if bad_ratio:
        raise ValueError(f"ratio {bad_ratio[0]} is outside (0, 1]")
    if settings.n < 1:
        raise ValueError(f"n must be >= 1 (items per task), got {settings.n}")
    if settings.profile not in PROFILES:
        raise ValueError(f"unknown template profile {settings.profile!r}; choose from {', '.join(PROFILES)}")
    if settings.length < 64:
        raise ValueError(f"length {settings.length} is too short; use at least 64 tokens")


class Harness:
    """The loaded model, presses and allocators of one comparison, checked against each other up front."""

    def __init__(self, settings: CompareSettings):
        validate(settings)
        self.settings = settings
        self.model, self.tokenizer, self.model_dir = models.load(settings.model)
        self.adapter = adapter_for(self.model)
        needs_calibration = "triattention" in settings.presses or "gate" in settings.allocators
        self.calibration = Calibration.load(self.model_dir) if needs_calibration else None
        self.presses = {}
        for name in settings.presses:
            if name == BASELINE:
                continue
            options = {"calibration": self.calibration} if name == "triattention" else {}
            press = presses.get(name, **options)
            try:
                press.check(self.adapter)
            except (ValueError, FileNotFoundError) as error:
                raise ValueError(f"press {name!r} cannot run on {self.model_dir}: {error}") from None
            self.presses[name] = press
        self.allocators = {name: allocators.get(name) for name in settings.allocators}
        for press in self.presses.values():
            for allocator in self.allocators.values():
                check_pair(press, allocator)
        self.evidence = EvidenceRequest()
        for press in self.presses.values():
            self.evidence = self.evidence | press.evidence(self.adapter)
        self.code = code_version()
        self.weights = models.fingerprint(self.model_dir)
        count = lambda text: len(self.tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
        self.task_config = Config(profile=settings.profile, length=settings.length, count_tokens=count)
        self.scbench_rows = {}
        for task in expand_tasks(settings.tasks):
            try:
                if task in SCBENCH:
                    self.scbench_rows[task] = load_rows(task.removeprefix("scbench_"), settings.scbench_data)
                self.item(task, 0)
            except (ValueError, FileNotFoundError, IndexError) as error:
                raise ValueError(f"task {task!r} at --length {settings.length}: {error}") from None

    @property
    def layer_weights(self):
        return self.calibration.gate_weights if self.calibration else None

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor(self.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)

    def item(self, task: str, index: int):
        """Item ``index`` of ``task``: generated (RULER) or read and middle-truncated (SCBench)."""
        if task in SCBENCH:
            rows = self.scbench_rows[task]
            if index >= len(rows):
                raise IndexError(f"{task} has only {len(rows)} rows")
            encode = lambda text: self.tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
            return to_item(task.removeprefix("scbench_"), rows[index], index, encode, self.tokenizer.decode,
                           self.settings.length)
        return generate(task, index, self.settings.seed, self.task_config)


def _base_row(h: Harness, task: str, item, question_index: int) -> dict:
    s = h.settings
    return {"model": str(h.model_dir.name), "weights": h.weights, "task": task, "profile": s.profile, "length": s.length,
            "item": item.index, "question": question_index, "seed": s.seed, "code": h.code}


def _answer_all(h: Harness, cache, item, rows: list[dict], store: ResultStore, extra: dict) -> None:
    for question, row in zip(item.questions, rows):
        if store.has(row_key({**row, **extra})):
            continue
        answer = cache.answer(h.encode(question.prompt), question.max_new_tokens, h.tokenizer.eos_token_id)
        scores = {"score": question.scorer(answer.text)} if question.scorer else {
            "score": METRICS[item.metric](answer.text, question.answers)}
        if question.official:
            scores["score_official"] = question.official(answer.text)
        store.append({**row, **extra, **scores, "prediction": answer.text, "answers": question.answers})


def run_compare(settings: CompareSettings, show_progress: bool = True) -> ResultStore:
    """Run (or resume) the comparison; returns the store with every row of this run."""
    h = Harness(settings)
    store = ResultStore(settings.out)
    store.check_model(str(h.model_dir.name), h.weights)
    tasks = expand_tasks(settings.tasks)
    combos = [(p, a, r) for p in h.presses for a in h.allocators for r in settings.ratios]
    bar = tqdm(total=len(tasks) * settings.n * (1 + len(combos)), disable=not show_progress, unit="fork",
               desc="compare")
    for task in tasks:
        for index in range(settings.n):
            try:
                item = h.item(task, index)
            except IndexError:  # an SCBench task with fewer rows than --n
                bar.update(1 + len(combos))
                continue
            rows = [_base_row(h, task, item, q) for q in range(len(item.questions))]
            settings_of = [(BASELINE, BASELINE, 1.0)] + combos

            def pending(press, alloc, ratio):
                extra = {"press": press, "allocator": alloc, "ratio": ratio}
                return any(not store.has(row_key({**r, **extra})) for r in rows)

            todo = [combo for combo in settings_of if pending(*combo)]
            bar.update(len(settings_of) - len(todo))
            if not todo:
                continue
            context = h.encode(item.context)
            protected = len(h.encode(item.protected_text))
            t0 = time.perf_counter()
            parent = prefill(h.model, context, protected=protected, evidence=h.evidence, tokenizer=h.tokenizer)
            prefill_seconds = time.perf_counter() - t0
            scored: dict[str, tuple] = {}
            for press_name, alloc_name, ratio in todo:
                extra = {"press": press_name, "allocator": alloc_name, "ratio": ratio,
                         "prefill_seconds": round(prefill_seconds, 4), "n_context": parent.n, "protected": protected}
                if press_name == BASELINE:
                    child = parent.fork(parent.keep_all_plan())
                else:
                    if press_name not in scored:
                        t0 = time.perf_counter()
                        scored[press_name] = (h.presses[press_name].score(parent), time.perf_counter() - t0)
                    scores, seconds = scored[press_name]
                    plan = plan_for(parent, scores, h.allocators[alloc_name], ratio, h.layer_weights)
                    child = parent.fork(plan)
                    extra["score_seconds"] = round(seconds, 4)
                    extra["kept_entries"] = plan.total()
                _answer_all(h, child, item, rows, store, extra)
                child.release()
                bar.update(1)
            parent.release()
    bar.close()
    return store

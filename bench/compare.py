"""``bench compare``: every (press, allocator, kept fraction) on the same prefix-only fork protocol.

Per context: one prefill (with the union of the evidence the presses ask for), one scoring per press (a
:class:`presses.Selection`), one fork per (allocator, ratio) — only one child alive at a time — and every question
of the context answered from it. Besides accuracy every row stores the fidelity of the child against the full
cache on the same question (:mod:`bench.fidelity`).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

import allocators
import presses
from presses.calibration import Calibration
from presses.selection import Selection, check_pair
from runtime import EvidenceRequest, KeepPlan, adapter_for, encode_text, prefill
from runtime.batch import answer_many

from . import loading
from .corpus import check_haystack
from .fidelity import FullCacheReference, answer_log_probs, answer_log_probs_many, fidelity, reference_text
from .metrics import METRICS
from .needles import evidence_positions, mean_over_heads, needle_rank, needle_recall
from .store import BASELINE, KEY_FIELDS, SCHEMA, ResultStore, check_writable, code_version, row_key
from .tasks import PROFILES, TASKS, Config, generate
from .tasks.ruler import GENERATED, HAYSTACK_TASKS
from .tasks.scbench import SCBENCH_TASKS, load_rows, to_item

RATIO_GRIDS = {
    "default": (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
    "paper": (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
}
"""Named kept-fraction grids: ``default`` adds 0.02 and 0.05, where eviction bites, to the paper's grid."""
DEFAULT_RATIOS = RATIO_GRIDS["default"]
MIN_LENGTH = 64
ENGINES = ("hf", "vllm")
"""``hf``: this project's runtime on a transformers model; ``vllm``: compaction inside vLLM (:mod:`serving`)."""
SCBENCH = tuple(f"scbench_{t}" for t in SCBENCH_TASKS)
TASK_GROUPS = {"ruler": TASKS, "niah": tuple(t for t in TASKS if t.startswith("niah")), "scbench": SCBENCH,
               "haystack": HAYSTACK_TASKS}


@dataclass
class CompareSettings:
    presses: list[str]
    allocators: list[str] = field(default_factory=lambda: ["flat"])
    ratios: list[float] = field(default_factory=lambda: list(DEFAULT_RATIOS))
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

    def press_label(self, name: str) -> str:
        """The press's name in rows: with its options, if any, so that differently configured runs never mix."""
        return _label(name, self.press_options)

    def alloc_label(self, name: str) -> str:
        return _label(name, self.alloc_options)


def _label(name: str, options: dict) -> str:
    if not options:
        return name
    # lists with ';' so that a method name "press/allocator" keeps exactly one '/'
    shown = ",".join(f"{k}={';'.join(f'{x:g}' for x in v) if isinstance(v, list) else v}" for k, v in sorted(options.items()))
    return f"{name}({shown})"


def expand_tasks(names: list[str]) -> list[str]:
    out: list[str] = []
    for name in names:
        for task in TASK_GROUPS.get(name, (name,)):
            if task not in out:
                out.append(task)
    return out


def _nonempty(values: list, what: str, allowed: str) -> None:
    if not values:
        raise ValueError(f"{what} is empty; give at least one of: {allowed}")


def validate(settings: CompareSettings) -> None:
    """Every error that can be known before the model loads, as one clear ``ValueError``. The press and allocator
    options are replaced by their typed values (what rows record)."""
    available_presses = ", ".join(presses.available() + [BASELINE])
    _nonempty(settings.presses, "--press", available_presses)
    _nonempty(settings.allocators, "--alloc", ", ".join(allocators.available()))
    _nonempty(settings.ratios, "--ratios", "kept fractions in (0, 1], or a grid name: " + ", ".join(RATIO_GRIDS))
    _nonempty(settings.tasks, "--tasks", "task names or the groups ruler, niah, scbench")
    # unknown names, ill-typed options and unbuildable presses fail here, with the valid choices; the options
    # are then held typed by their fields, so that rows name what ran (normalized_anchor=no runs and reads False)
    for name in settings.presses:
        if name != BASELINE:
            settings.press_options = presses.options_of(name, settings.press_options)
    for name in settings.allocators:
        settings.alloc_options = allocators.options_of(name, settings.alloc_options)
    layers = loading.attention_layer_count(settings.model)
    if layers is not None:
        for name in settings.allocators:
            allocators.get(name, **settings.alloc_options).check_layers(layers)
    unknown_task = [t for t in expand_tasks(settings.tasks) if t not in TASKS + SCBENCH]
    if unknown_task:
        raise ValueError(f"unknown task {unknown_task[0]!r}; available: {', '.join(TASKS + SCBENCH)} "
                         "(or the groups ruler, niah, scbench)")
    if any(t in SCBENCH for t in expand_tasks(settings.tasks)) and settings.scbench_data is None:
        raise ValueError("SCBench tasks read a local copy of microsoft/SCBench: pass --scbench-data DIR")
    for ratio in settings.ratios:
        allocators.check_keep_fraction(ratio, "ratio")
    if isinstance(settings.jobs, bool) or not isinstance(settings.jobs, int) or settings.jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1 (worker processes), got {settings.jobs!r}")
    if isinstance(settings.batch, bool) or not isinstance(settings.batch, int) or settings.batch < 1:
        raise ValueError(f"batch must be an integer >= 1 (children answered together), got {settings.batch!r}")
    if settings.n < 1:
        raise ValueError(f"n must be >= 1 (items per task), got {settings.n}")
    if settings.haystack != GENERATED:
        check_haystack(settings.haystack)
        if not set(expand_tasks(settings.tasks)) & set(HAYSTACK_TASKS):
            raise ValueError(f"--haystack {settings.haystack}: none of the tasks reads a haystack; those that do: "
                             f"{', '.join(HAYSTACK_TASKS)} (the group 'haystack')")
    if settings.profile not in PROFILES:
        raise ValueError(f"unknown template profile {settings.profile!r}; choose from {', '.join(PROFILES)}")
    if settings.length < MIN_LENGTH:
        raise ValueError(f"length {settings.length} is too short; use at least {MIN_LENGTH} tokens")
    limit = loading.position_limit(settings.model)
    if limit is not None and settings.length > limit:
        raise ValueError(f"length {settings.length} is longer than the model's position limit "
                         f"(max_position_embeddings = {limit})")
    if settings.engine not in ENGINES:
        raise ValueError(f"unknown engine {settings.engine!r}; choose from {', '.join(ENGINES)}")
    if settings.engine == "vllm":
        _validate_served(settings)
    check_writable(Path(settings.out))


def _validate_served(settings: CompareSettings) -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ValueError("--engine vllm needs vLLM, which lives in its own environment: scripts/serving_env.sh")
    from serving import ENGINE_PRESSES

    refused = [name for name in settings.presses if name not in ENGINE_PRESSES + (BASELINE,)]
    if refused:
        raise ValueError(f"press {refused[0]!r} does not run in the vLLM engine; presses there: "
                         f"{', '.join(ENGINE_PRESSES)}")
    if settings.allocators != ["flat"]:
        raise ValueError(f"--alloc {','.join(settings.allocators)}: the vLLM engine compacts equal counts per layer "
                         "and head, allocator 'flat' only")
    if settings.jobs != 1:
        raise ValueError(f"--jobs {settings.jobs}: the vLLM engine runs in one process (use --jobs 1)")


class Harness:
    """The loaded model, presses and allocators of one comparison, checked against each other up front.
    ``settings`` have passed :func:`validate` (:func:`run_compare` does it before taking the store's lock)."""

    def __init__(self, settings: CompareSettings):
        self.settings = settings
        self.model, self.tokenizer, self.model_dir = loading.load(settings.model)
        loading.check_artifacts(self.model_dir)  # a damaged estimator or calibration is named before any work
        self.adapter = adapter_for(self.model)
        self.presses, self.press_names = {}, {}
        for name in settings.presses:
            if name == BASELINE:
                continue
            press = presses.get(name, **settings.press_options)
            try:
                press.bind(self.model_dir)
                press.check(self.adapter)
            except (ValueError, FileNotFoundError) as error:
                raise ValueError(f"press {name!r} cannot run on {self.model_dir}: {error}") from None
            self.presses[settings.press_label(name)] = press
            self.press_names[settings.press_label(name)] = name
        self.allocators = {settings.alloc_label(name): allocators.get(name, **settings.alloc_options)
                           for name in settings.allocators}
        self.layer_weights = None
        if any(a.needs_layer_weights for a in self.allocators.values()):
            self.layer_weights = Calibration.load(self.model_dir).gate_weights
        for press in self.presses.values():
            for allocator in self.allocators.values():
                check_pair(press, allocator)
        self.evidence = EvidenceRequest()
        for press in self.presses.values():
            self.evidence = self.evidence | press.evidence(self.adapter)
        self.code = code_version()
        self.identity = loading.identity(self.model_dir)
        self.dtype, self.device = loading.dtype_name(settings.model), loading.device_name(settings.model)
        self.engine = None
        if settings.engine == "vllm":
            from serving import CompactingLLM

            # each child sets its press (use_press). On CPU vLLM checks gpu_memory_utilization of the machine's
            # memory against what is free (the HF copy of the model this harness holds takes some) and the KV pool
            # gets kv_cache_memory_bytes: 1 GiB holds 80K tokens of the 0.8B geometry
            self.engine = CompactingLLM(str(self.model_dir), press="keydiff", max_model_len=settings.length + 512,
                                        max_num_seqs=1, gpu_memory_utilization=0.3, kv_cache_memory_bytes=1 << 30)
        self.task_config = Config(profile=settings.profile, length=settings.length,
                                  count_tokens=lambda text: len(encode_text(self.tokenizer, text)),
                                  haystack=settings.haystack)
        self.scbench_rows = {}
        for task in expand_tasks(settings.tasks):
            try:
                if task in SCBENCH:
                    self.scbench_rows[task] = load_rows(task.removeprefix("scbench_"), settings.scbench_data)
                self.item(task, 0)
            except (ValueError, FileNotFoundError, IndexError) as error:
                raise ValueError(f"task {task!r} at --length {settings.length}: {error}") from None

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor(encode_text(self.tokenizer, text), dtype=torch.long)

    def item(self, task: str, index: int):
        """Item ``index`` of ``task``: generated (RULER) or read and middle-truncated (SCBench)."""
        if task in SCBENCH:
            rows = self.scbench_rows[task]
            if index >= len(rows):
                raise IndexError(f"{task} has only {len(rows)} rows")
            return to_item(task.removeprefix("scbench_"), rows[index], index,
                           lambda text: encode_text(self.tokenizer, text), self.tokenizer.decode,
                           self.settings.length)
        return generate(task, index, self.settings.seed, self.task_config)


def _base_row(h: Harness, task: str, item, question_index: int) -> dict:
    s = h.settings
    return {"schema": SCHEMA, "model": str(h.model_dir.name), **h.identity.row_fields(), "task": task,
            "profile": s.profile, "length": s.length, "item": item.index, "question": question_index, "seed": s.seed,
            "code": h.code, "engine": s.engine, "dtype": h.dtype, "device": h.device, "haystack": item.haystack}


class _Question:
    """One question of an item, encoded, with its full-cache reference computed once from the parent and the
    context positions of its evidence (None when the task has none)."""

    def __init__(self, h: Harness, question, parent, context: str):
        self.question = question
        self.prompt_ids = h.encode(question.prompt)
        self.evidence = self.answer_tokens = None
        if question.evidence:
            encode = lambda text: encode_text(h.tokenizer, text)  # noqa: E731
            self.evidence = evidence_positions(encode, context, question.evidence)
            self.answer_tokens = evidence_positions(encode, context, question.evidence, question.answers)
        answer_ids = h.encode(reference_text(question.prefix, question.answers[0]))
        self.reference = FullCacheReference(
            answer_ids, answer_log_probs(parent, self.prompt_ids, answer_ids),
            parent.answer(self.prompt_ids, question.max_new_tokens, h.tokenizer.eos_token_id).tokens)


def _needle_fields(q: _Question, plan, rank) -> dict:
    """Needle recall of a compacted child's plan on one question (:mod:`bench.needles`); ``rank()`` gives the
    answer tokens' rank under the press's scores (None where the scores stay in the engine)."""
    if q.evidence is None:
        return {}
    sentence, answer = needle_recall(plan, q.evidence), needle_recall(plan, q.answer_tokens)
    return {"needle_recall": mean_over_heads(sentence), "needle_recall_layers": sentence,
            "answer_recall": mean_over_heads(answer), "answer_recall_layers": answer, "answer_rank_layers": rank()}


def _row(h: Harness, item, q: _Question, row: dict, extra: dict, answer, log_probs: torch.Tensor,
         needles: dict | None = None) -> dict:
    """The stored row of one answered question: accuracy, fidelity against the full cache, the prediction, and
    (NIAH tasks, compacted children) the needle diagnostics."""
    question = q.question
    scores = {"score": question.scorer(answer.text)} if question.scorer else {
        "score": METRICS[item.metric](answer.text, question.answers)}
    if question.official:
        scores["score_official"] = question.official(answer.text)
    scores.update(fidelity(q.reference, log_probs, answer.tokens))
    return {**row, **extra, **scores, **(needles or {}), "prediction": answer.text, "answers": question.answers}


def _answer_batch(h: Harness, item, questions: list[_Question], rows: list[dict], children: list, extras: list[dict],
                  is_done, emit, needles) -> None:
    """Every pending question of every child, the children of a question answered as one batch; ``needles(i, q)``
    gives child i's needle fields on question q."""
    for q, row in zip(questions, rows):
        members = [i for i, extra in enumerate(extras) if not is_done(row_key({**row, **extra}))]
        if not members:
            continue
        batch = [children[i] for i in members]
        answers = answer_many(batch, q.prompt_ids, q.question.max_new_tokens, h.tokenizer.eos_token_id)
        log_probs = answer_log_probs_many(batch, q.prompt_ids, q.reference.answer_ids)
        for i, answer, child_log_probs in zip(members, answers, log_probs):
            emit(_row(h, item, q, row, extras[i], answer, child_log_probs, needles(i, q)))


def _context(h: Harness, task: str, index: int, is_done, emit) -> int:
    """Answer every pending (press, allocator, ratio) of one context; ``emit`` each row. Returns the forks run."""
    try:
        item = h.item(task, index)
    except IndexError:  # an SCBench task with fewer rows than --n
        return 0
    rows = [_base_row(h, task, item, q) for q in range(len(item.questions))]
    combos = [(BASELINE, BASELINE, 1.0)] + [(p, a, r) for p in h.presses for a in h.allocators
                                            for r in h.settings.ratios]
    todo = [(press, alloc, ratio) for press, alloc, ratio in combos
            if any(not is_done(row_key({**r, "press": press, "allocator": alloc, "ratio": ratio})) for r in rows)]
    if todo:
        context, protected = h.encode(item.context), len(h.encode(item.protected_text))
        run = _runtime_context if h.engine is None else _served_context
        run(h, item, rows, todo, context, protected, is_done, emit)
    return len(todo)


def _answer_alone(h: Harness, item, questions: list[_Question], rows: list[dict], child, extra: dict, is_done,
                  emit, needles=lambda q: None) -> None:
    """Every pending question of one child, answered one at a time; ``needles(q)`` gives its needle fields."""
    for q, row in zip(questions, rows):
        if not is_done(row_key({**row, **extra})):
            answer = child.answer(q.prompt_ids, q.question.max_new_tokens, h.tokenizer.eos_token_id)
            emit(_row(h, item, q, row, extra, answer, answer_log_probs(child, q.prompt_ids, q.reference.answer_ids),
                      needles(q)))


def _runtime_context(h: Harness, item, rows, todo, context, protected: int, is_done, emit) -> None:
    """One prefill, one scoring per press, one fork per (allocator, ratio). The no-prune child is answered alone
    (the full cache against itself: its ΔNLL and KL are exactly 0); the compacted children are answered
    ``settings.batch`` at a time (:mod:`runtime.batch`)."""
    t0 = time.perf_counter()
    parent = prefill(h.model, context, protected=protected, evidence=h.evidence, tokenizer=h.tokenizer)
    prefill_seconds = time.perf_counter() - t0
    questions = [_Question(h, question, parent, item.context) for question in item.questions]
    selections = {name: Selection(parent, press, h.layer_weights) for name, press in h.presses.items()}
    common = {"prefill_seconds": round(prefill_seconds, 4), "n_context": parent.n, "protected": protected}
    ranks: dict[tuple, dict] = {}

    def answer_rank(selection: Selection, q: _Question) -> dict:
        # the rank depends on the press and the question only: once for all of a press's children
        key = (id(selection), id(q))
        if key not in ranks:
            ranks[key] = needle_rank(selection.scores, q.answer_tokens, protected)
        return ranks[key]

    if todo[0][0] == BASELINE:
        child = parent.fork(parent.keep_all_plan())
        extra = {"press": BASELINE, "allocator": BASELINE, "ratio": 1.0, **common,
                 "kv_bytes": child.kv_nbytes, "gdn_bytes": child.gdn_nbytes}
        _answer_alone(h, item, questions, rows, child, extra, is_done, emit)
        child.release()
    # similar kept fractions side by side: a batch is padded to its largest child
    compacted = sorted((combo for combo in todo if combo[0] != BASELINE), key=lambda combo: combo[2])
    for start in range(0, len(compacted), h.settings.batch):
        children, extras, plans = [], [], []
        for press_name, alloc_name, ratio in compacted[start : start + h.settings.batch]:
            selection = selections[press_name]
            plan = selection.plan(h.allocators[alloc_name], ratio)
            plans.append((plan, selection))
            children.append(parent.fork(plan))
            extras.append({"press": press_name, "allocator": alloc_name, "ratio": ratio, **common,
                           "score_seconds": round(selection.score_seconds, 4), "kept_entries": plan.total(),
                           "kv_bytes": children[-1].kv_nbytes, "gdn_bytes": children[-1].gdn_nbytes})
        _answer_batch(h, item, questions, rows, children, extras, is_done, emit,
                      lambda i, q: _needle_fields(q, plans[i][0], lambda: answer_rank(plans[i][1], q)))
        for child in children:
            child.release()
    parent.release()


def _served_context(h: Harness, item, rows, todo, context, protected: int, is_done, emit) -> None:
    """The same protocol inside vLLM (:mod:`serving`): the full cache is the context held uncompacted, each
    compacted child its own prefill, scored and compacted in the engine; references come from the engine itself."""
    from serving.cache import EngineCache

    engine, ids = h.engine, context.tolist()
    parent = EngineCache(engine, engine.prefill(ids, 1.0, protected), h.tokenizer)
    try:
        questions = [_Question(h, question, parent, item.context) for question in item.questions]
        common = {"prefill_seconds": round(parent.held.prefill_seconds, 4), "n_context": parent.n,
                  "protected": protected}
        if todo[0][0] == BASELINE:
            extra = {"press": BASELINE, "allocator": BASELINE, "ratio": 1.0, **common,
                     "kv_bytes": parent.kv_nbytes, "gdn_bytes": parent.gdn_nbytes}
            _answer_alone(h, item, questions, rows, parent, extra, is_done, emit)
        for press_name, alloc_name, ratio in (combo for combo in todo if combo[0] != BASELINE):
            engine.use_press(h.press_names[press_name], h.settings.press_options)
            child = EngineCache(engine, engine.prefill(ids, ratio, protected, allocator=alloc_name), h.tokenizer)
            try:
                extra = {"press": press_name, "allocator": alloc_name, "ratio": ratio, **common,
                         "score_seconds": round(child.held.score_seconds, 4),
                         "kept_entries": sum(len(head) for heads in child.held.plan.values() for head in heads),
                         "kv_bytes": child.kv_nbytes, "gdn_bytes": child.gdn_nbytes}
                # the engine scores inside vLLM: the plan comes back, the scores do not (no rank)
                plan = KeepPlan({int(layer): heads for layer, heads in child.held.plan.items()})
                _answer_alone(h, item, questions, rows, child, extra, is_done, emit,
                              lambda q: _needle_fields(q, plan, lambda: None))
            finally:
                child.release()
    finally:
        parent.release()


_WORKER: Harness | None = None


def _start_worker(settings: CompareSettings) -> None:
    global _WORKER
    torch.set_num_threads(1)  # one core per process: decoding is bound by per-layer Python work, not by BLAS
    _WORKER = Harness(settings)


def _worker_context(job: tuple[str, int, set]) -> list[dict]:
    task, index, done = job
    rows: list[dict] = []
    _context(_WORKER, task, index, done.__contains__, rows.append)
    return rows


def run_compare(settings: CompareSettings, show_progress: bool = True) -> ResultStore:
    """Run (or resume) the comparison; returns the store with every row of this run."""
    validate(settings)
    store = ResultStore(settings.out)  # takes the writer's lock before the model loads
    try:
        store.check_schema()
        h = Harness(settings)
        store.check_model(str(h.model_dir.name), h.identity.row_fields())
        _run(h, store, show_progress)
    finally:
        store.close()
    return store


def run_rows(store: ResultStore, settings: CompareSettings) -> list[dict]:
    """The rows of ``store`` that this run's settings produce (its model, weights and code version included), so
    that a summary never mixes in other runs written to the same directory."""
    model_dir = loading.resolve(settings.model)
    identity = loading.identity(model_dir)
    wanted = {"model": model_dir.name, "weights": identity.model, "artifacts": identity.artifacts,
              "code": code_version(), "length": settings.length, "profile": settings.profile, "seed": settings.seed,
              "engine": settings.engine, "dtype": loading.dtype_name(settings.model),
              "device": loading.device_name(settings.model)}
    combos = {(BASELINE, BASELINE, 1.0)} | {(settings.press_label(p), settings.alloc_label(a), float(r))
                                            for p in settings.presses for a in settings.allocators
                                            for r in settings.ratios}
    tasks = set(expand_tasks(settings.tasks))
    haystack = lambda task: settings.haystack if task in HAYSTACK_TASKS else GENERATED  # noqa: E731
    return [r for r in store.rows if all(r.get(k) == v for k, v in wanted.items()) and r["task"] in tasks
            and r.get("haystack", GENERATED) == haystack(r["task"])
            and (r["press"], r["allocator"], float(r["ratio"])) in combos and r["item"] < settings.n]


def _run(h: Harness, store: ResultStore, show_progress: bool) -> None:
    settings = h.settings
    contexts = [(task, index) for task in expand_tasks(settings.tasks) for index in range(settings.n)]
    per_context = 1 + len(h.presses) * len(h.allocators) * len(settings.ratios)
    bar = tqdm(total=len(contexts) * per_context, disable=not show_progress, unit="fork", desc="compare")
    # a worker answers one context at a time and loads its own model: workers beyond the contexts only cost memory
    workers = min(settings.jobs, len(contexts))
    if workers < settings.jobs:
        print(f"note: --jobs {settings.jobs} capped at {workers}: the run has {len(contexts)} context(s)",
              file=sys.stderr)
    if workers > (os.cpu_count() or 1):
        print(f"warning: {workers} worker processes on {os.cpu_count()} CPU core(s): each loads the model and "
              "wants a core of its own; they will compete", file=sys.stderr)
    try:
        _run_contexts(h, store, contexts, workers, lambda: bar.update(per_context))
    finally:  # an error then starts on a line of its own
        bar.close()


def _run_contexts(h: Harness, store: ResultStore, contexts: list[tuple], workers: int, done) -> None:
    """Every context answered, in this process or by ``workers`` worker processes; ``done()`` after each."""
    if workers <= 1:
        for task, index in contexts:
            _context(h, task, index, store.has, store.append)
            done()
    else:
        import multiprocessing

        # each worker loads its own model and answers whole contexts; only this process writes the store
        done_by_context: dict[tuple, set] = {}
        for key in store.done:
            done_by_context.setdefault((key[KEY_FIELDS.index("task")], key[KEY_FIELDS.index("item")]), set()).add(key)
        jobs = [(task, index, done_by_context.get((task, index), set())) for task, index in contexts]
        with multiprocessing.get_context("spawn").Pool(workers, _start_worker, (h.settings,)) as pool:
            for rows in pool.imap_unordered(_worker_context, jobs):
                for row in rows:
                    store.append(row)
                done()

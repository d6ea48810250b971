"""Append-only JSONL result store: one row per answered question, keyed by every setting that produced it.

A killed run resumes where it stopped: finished keys are skipped, a half-written last line is ignored, and
nothing already written is ever rewritten. One writer at a time holds the store's lock; lines that are not rows
are skipped with one warning naming the file and lines. A committed store (``results.jsonl.gz`` alone) is resumed
too: its rows are copied to ``results.jsonl`` before the first new one is appended there, and the ``.gz`` is kept.
"""

from __future__ import annotations

import ast
import fcntl
import gzip
import hashlib
import json
import math
import os
import reprlib
import sys
from pathlib import Path

from artifacts.files import atomic_path
from artifacts.outputs import Output, check_place
from runtime.errors import UsageError
from workloads.tasks.registry import haystack_of

KEY_FIELDS = ("model", "weights", "artifacts", "press", "allocator", "keep_fraction", "task", "profile", "length",
              "item", "question", "seed", "code", "engine", "dtype", "device", "haystack")
GROUP_FIELDS = ("model", "weights", "artifacts", "profile", "length", "code", "engine", "dtype", "device")
"""Rows are averaged only within one group of these settings."""
SHARED_FIELDS = (*GROUP_FIELDS, "seed")
"""What every row of one run shares: its group and its seed (the shards of a run share them too)."""
SHOWN = 5
"""How many missing rows or methods a message lists."""
LEGACY_DEFAULTS = {"engine": "hf", "dtype": "float32", "device": "cpu", "haystack": "generated"}
"""What rows written before these fields existed ran with: the HF runtime (the only engine), float32 on CPU (the
only settings of the runs the committed store holds), on the generated haystacks (the only ones then)."""
LEGACY_NAMES = {"keep_fraction": "ratio"}
"""Fields that rows written before were stored under another name; they are read under the new one."""
OPTIONAL_FIELDS = ("artifacts",)
"""Key fields that rows written before them lack: their ``weights`` fingerprint covered the artifacts too."""
BASELINE = "none"
"""The no-prune method's name in rows (its press and its allocator)."""
SCHEMA = 2
"""Version of a row's fields; 2 added the fidelity metrics (answer_nll, delta_nll, kl, agree)."""
FIDELITY_FIELDS = ("answer_nll", "delta_nll", "kl", "agree")
FRACTION_FIELDS = ("score", "score_official", "needle_recall", "answer_recall")
"""Fields that hold one fraction in [0, 1] (accuracy, the share of the needle's entries kept); ``score`` is
required, the others are absent where they do not apply."""
PER_LAYER_FRACTION_FIELDS = ("needle_recall_layers", "answer_recall_layers", "answer_rank_layers")
"""Fields that hold ``{layer: [one fraction in [0, 1] per KV head]}``: recalls, and the answer tokens' percentile rank
under the press's scores (None where the scores stay in the engine)."""
RUN = "run"
"""The field by which a row names its run: ``{"tasks": [...], "n": n, "haystack": name, "shard": k, "shards": N}``.
The run answers items 0 … n − 1 of each task, in that order (its contexts, at positions 0, 1, …), on that haystack;
its shard ``k/N`` took the positions k, k + N, … (an unsharded run is shard 0/1). Rows written before it lack it
(every committed store): their stores are checked context by context only (:mod:`bench.completeness`)."""
RUN_FIELDS = ("tasks", "n", "haystack", "shard", "shards")

ROOT = Path(__file__).resolve().parent.parent
RESULT_ENTRIES = ("bench.harness", "bench.context_run", "bench.rows", "bench.settings")
"""Where a row's values are made. :func:`code_version` hashes every module of the project these import, directly or
through others (imports inside functions too), so a new module of the runtime or a press is covered by itself."""
NOT_RESULT_CODE = ("bench.store", "artifacts.files")
"""Imported by the entries (or liable to be) but not deciding a value (the store reads and writes rows; artifacts.files
writes files atomically): editing them keeps stores."""
ENGINE_PACKAGES = {"hf": (), "vllm": ("serving",)}
"""Packages only one engine's rows run, hashed whole into its rows (vLLM loads the plugin's worker by name, not by an
import) and never into another engine's: the serving plugin is not hashed into the runtime's (``hf``) rows."""


def _module_file(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imports(name: str, path: Path) -> set[str]:
    """The project modules ``name`` (at ``path``) imports, anywhere in it: ``from a import b`` counts ``a.b`` where
    that is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = node.module or ""
            if node.level:
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    # a module's packages run their __init__ too
    return {".".join(m.split(".")[:i]) for m in found for i in range(1, m.count(".") + 2)
            if _module_file(".".join(m.split(".")[:i])) is not None}


def result_modules(engine: str = "hf") -> list[str]:
    """The project modules whose code decides the rows of ``engine``: those :data:`RESULT_ENTRIES` import, directly
    or through others, less :data:`NOT_RESULT_CODE` and the packages of the other engines
    (:data:`ENGINE_PACKAGES`)."""
    excluded = {p for other, packages in ENGINE_PACKAGES.items() if other != engine for p in packages}
    seen, todo = set(), list(RESULT_ENTRIES)
    todo += [".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")  # the engine's own
             for package in ENGINE_PACKAGES.get(engine, ()) for path in sorted((ROOT / package).rglob("*.py"))]
    while todo:
        name = todo.pop()
        if name in seen or name in NOT_RESULT_CODE or name.split(".")[0] in excluded:
            continue
        seen.add(name)
        todo.extend(_imports(name, _module_file(name)))
    return sorted(seen)


def _normalised_source(path: Path) -> bytes:
    """The module's syntax tree without docstrings: comments, docstrings and formatting do not change it."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(
            getattr(body[0], "value", None), ast.Constant
        ) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree).encode()


def code_version(engine: str = "hf") -> str:
    """Hash of the modules that decide ``engine``'s rows (:func:`result_modules`), docstrings and comments ignored.
    Rows keep the version they were written with (``bench verify`` reads it, never recomputes it)."""
    digest = hashlib.sha256()
    for name in result_modules(engine):
        path = _module_file(name)
        digest.update(path.relative_to(ROOT).as_posix().encode())
        digest.update(_normalised_source(path))
    return digest.hexdigest()[:12]


def row_key(row: dict) -> tuple:
    return tuple(row.get(field) for field in KEY_FIELDS)


def _is_row(value) -> bool:
    return isinstance(value, dict) and all(f in value for f in ("model", "press", "allocator", "task", "item")) and (
        "keep_fraction" in value or LEGACY_NAMES["keep_fraction"] in value)


KL_TOLERANCE = 1e-6
"""KL below 0 by at most this much is float rounding of a child almost equal to the full cache."""


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _count_problem(row: dict) -> str | None:
    """The context's sizes, where a row records them: ``n_context`` tokens, ``protected`` of them kept by every
    method, ``body_entries`` attention entries a press chooses among, and the ``kept_entries`` of a compacted child
    (at most all of them)."""
    bounds = [("n_context", None), ("protected", "n_context"), ("body_entries", None), ("kept_entries", "body_entries")]
    for field, bound in bounds:
        value, limit = row.get(field), row.get(bound) if bound else None
        if value is None:
            continue
        if not _count(value) or (_count(limit) and value > limit):
            within = f" at most {bound} = {limit}" if _count(limit) else ""
            return f"{field}={value!r} (expected an integer >= 0{within})"
    return None


def _fraction(value) -> bool:
    return _number(value) and 0 <= value <= 1


def _per_layer_problem(row: dict) -> str | None:
    """The first value of a :data:`PER_LAYER_FRACTION_FIELDS` field that is not a fraction, or its wrong shape."""
    for field in PER_LAYER_FRACTION_FIELDS:
        layers = row.get(field)
        if layers is None:
            continue
        if not isinstance(layers, dict) or not all(isinstance(heads, list) for heads in layers.values()):
            return f"{field}={reprlib.repr(layers)} (expected {{layer: [a number in [0, 1] per head]}})"
        for layer, heads in layers.items():
            for head, value in enumerate(heads):
                if not _fraction(value):
                    return f"{field}[{layer!r}][{head}]={value!r} (expected a number in [0, 1])"
    return None


def shard_contexts(run: dict) -> list[tuple[str, int]]:
    """``(task, item)`` of every context of the shard ``run`` (:data:`RUN`) names, in order: its positions k, k + N,
    … of the run's list."""
    contexts = [(task, item) for task in run["tasks"] for item in range(run["n"])]
    return contexts[run["shard"]::run["shards"]]


def _run_problem(row: dict) -> str | None:
    """What is wrong with the run a row names (:data:`RUN`), or None (also for a row written before runs were
    recorded): its fields of their types, and the row's context one its shard took."""
    run = row.get(RUN)
    if run is None:
        return None
    if not (isinstance(run, dict) and set(run) == set(RUN_FIELDS) and isinstance(run["tasks"], list) and run["tasks"]
            and all(isinstance(task, str) for task in run["tasks"]) and len(set(run["tasks"])) == len(run["tasks"])
            and _count(run["n"]) and run["n"] >= 1 and _count(run["shard"]) and _count(run["shards"])
            and run["shard"] < run["shards"] and isinstance(run["haystack"], str)):
        return (f"{RUN}={reprlib.repr(run)} (expected {{'tasks': [task names, each once], 'n': items per task >= 1, "
                "'haystack': name, 'shard': k, 'shards': N > k}})")
    task, item = row["task"], row["item"]
    if task not in run["tasks"] or not _count(item) or item >= run["n"] or row["haystack"] != haystack_of(
            task, run["haystack"]):
        return (f"task {task}, item {item!r} (haystack {row['haystack']}) is not a context of its run (items 0 … "
                f"{run['n'] - 1} of {', '.join(run['tasks'])}, haystack {run['haystack']})")
    position, k, count = run["tasks"].index(task) * run["n"] + item, run["shard"], run["shards"]
    if position % count != k:
        return (f"task {task}, item {item} (position {position} of its run) is not a context of shard {k}/{count} "
                f"(positions {k}, {k + count}, …)")
    return None


def row_problem(row: dict) -> str | None:
    """What is wrong with one row, or None: every key and fidelity field present; every fraction
    (:data:`FRACTION_FIELDS`, :data:`PER_LAYER_FRACTION_FIELDS`) in [0, 1]; keep_fraction in (0, 1]; answer_nll and
    delta_nll finite numbers; kl a finite number >= 0; agree a boolean; the context's counts within its size
    (:func:`_count_problem`); its context one of its run's shard (:func:`_run_problem`); and a no-prune row — the
    full cache compared with itself — at exactly zero ΔNLL and KL, agreeing."""
    missing = [f for f in (*KEY_FIELDS, "score", *FIDELITY_FIELDS) if row.get(f) is None and f not in OPTIONAL_FIELDS]
    if missing:
        return f"missing {', '.join(missing)}"
    checks = [*((field, lambda v: v is None or _fraction(v), "a number in [0, 1]") for field in FRACTION_FIELDS),
              ("keep_fraction", lambda v: _number(v) and 0 < v <= 1, "a number in (0, 1]"),
              ("answer_nll", _number, "a finite number"),
              ("delta_nll", _number, "a finite number"),
              ("kl", lambda v: _number(v) and v >= -KL_TOLERANCE, "a finite number >= 0"),
              ("agree", lambda v: isinstance(v, bool), "true or false")]
    for field, valid, allowed in checks:
        if not valid(row.get(field)):
            return f"{field}={row.get(field)!r} (expected {allowed})"
    problem = _per_layer_problem(row) or _count_problem(row) or _run_problem(row)
    if problem:
        return problem
    if row["press"] == BASELINE and (row["delta_nll"] != 0 or row["kl"] != 0 or row["agree"] is not True):
        return (f"the no-prune row has delta_nll={row['delta_nll']}, kl={row['kl']}, agree={row['agree']} "
                "(expected exactly 0, 0, true)")
    return None


def _same_values(a: dict, b: dict) -> bool:
    # the timings of one context are measured where it ran, and the run that wrote it is where the row comes from,
    # not a value of it: two copies of a row may differ in them alone
    def values(row: dict) -> dict:
        return {k: v for k, v in row.items() if not k.endswith("_seconds") and k != RUN}
    return values(a) == values(b)


def method_of(row: dict) -> str:
    """A row's method as reports name it: ``press/allocator``, or ``none`` for no prune."""
    return BASELINE if row["press"] == BASELINE else f"{row['press']}/{row['allocator']}"


def method_at(row: dict) -> str:
    """A row's method at its kept fraction (``gatesight/flat p=0.1``), as messages name it."""
    return f"{method_of(row)} p={row['keep_fraction']:g}"


def listed(values) -> str:
    """The first :data:`SHOWN` of ``values``, sorted, for a message; how many more there are."""
    values = sorted(values)
    return ", ".join(values[:SHOWN]) + (f", … ({len(values) - SHOWN} more)" if len(values) > SHOWN else "")


def describe_row(row: dict) -> str:
    """A row as messages name it: its method, kept fraction, task, item and question."""
    return (f"{method_of(row)} at p={row['keep_fraction']:g}, task {row['task']}, item {row['item']}, question "
            f"{row['question']}")


def check_one_value(stores: list["ResultStore"], copies: bool = False) -> None:
    """``ValueError`` naming (by file and line) the first row key that two rows of ``stores`` hold with other values:
    one key, one value. With ``copies`` False, also a key held twice with the same values, which a report would
    count twice (``bench merge`` passes True: it keeps one copy)."""
    seen: dict[tuple, tuple[dict, str]] = {}
    for store in stores:
        for row, line in zip(store.rows, store.line_numbers):
            key, where = row_key(row), f"{store.path}:{line}"
            if key not in seen:
                seen[key] = (row, where)
                continue
            first, there = seen[key]
            if not _same_values(first, row):
                raise UsageError(f"{there} and {where} hold the row of {describe_row(row)} with other values: one "
                                 "key, one value (shards of one run agree on every row they share)")
            if not copies:
                raise UsageError(f"{there} and {where} both hold the row of {describe_row(row)}: a report would count "
                                 "it twice; keep one copy (bench merge joins stores, keeping one)")


def verify_rows(rows: list[dict], where=None) -> list[str]:
    """What is wrong with ``rows`` (empty if nothing; :func:`row_problem`), each problem prefixed by
    ``where(index)`` (default ``row N``)."""
    where = where or (lambda index: f"row {index + 1}")
    return [f"{where(index)}: {problem}" for index, row in enumerate(rows) if (problem := row_problem(row))]


class ResultStore:
    """``results.jsonl`` under ``directory``, or a committed ``results.jsonl.gz`` there alone.

    A writer resumes a committed store: before its first row it copies the ``.gz``'s rows to ``results.jsonl``
    (atomically), where it appends; the ``.gz`` is kept. From then on ``results.jsonl`` continues the ``.gz`` (starts
    with its every byte) and is what readers read; a ``results.jsonl`` beside a ``.gz`` that it does not continue (a
    store written beside a committed one) is refused, since reading either would leave out the other's rows.

    Parameters
    ----------
    directory : path
    readonly : bool
        Readers (reports) take no lock; a writer takes an exclusive lock at once and keeps it while it lives,
        so that a second writer on the same directory is refused instead of duplicating rows.
    """

    def __init__(self, directory, readonly: bool = False):
        self.directory = Path(directory)
        self.live = self.directory / "results.jsonl"
        """Where rows are appended."""
        self.path = self.live
        """The file the rows were read from: ``live``, or the committed ``.gz`` until a first row is appended."""
        self.rows: list[dict] = []
        self.line_numbers: list[int] = []
        """The file's line of each row."""
        self.skipped: list[int] = []
        self.cut_line: int | None = None
        """The last line, if it is cut short (a run killed while writing it: a rerun resumes past it)."""
        self._lock = None
        if not readonly:
            self._acquire()
        packed = self.directory / "results.jsonl.gz"
        if packed.exists() and not self.live.exists():  # a committed, compressed store
            self.path = packed
        data = self._read(self.path) if self.path.exists() else b""
        if self.path == self.live and packed.exists() and not data.startswith(self._read(packed)):
            raise UsageError(f"{self.live} does not continue {packed} (it was not resumed from it): the committed "
                             "rows are in the .gz alone, and reports would read results.jsonl alone. Move "
                             "results.jsonl to a directory of its own, or join the two into one results.jsonl (the "
                             ".gz's lines first)")
        lines = data.split(b"\n")
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            try:
                value = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                value = None
            if _is_row(value):
                for field, legacy in LEGACY_NAMES.items():
                    if legacy in value:
                        value[field] = value.pop(legacy)
                for field, default in LEGACY_DEFAULTS.items():
                    value.setdefault(field, default)
                self.rows.append(value)
                self.line_numbers.append(number)
            elif number == len(lines) and not raw.endswith(b"}"):  # a last line cut by a kill is normal
                self.cut_line = number
            else:
                self.skipped.append(number)
        # an append ends a last line without its newline first
        self._next_line = data.count(b"\n") + (2 if data and not data.endswith(b"\n") else 1)
        if self.skipped:
            shown = ", ".join(map(str, self.skipped[:10])) + (" …" if len(self.skipped) > 10 else "")
            print(f"warning: {self.path}: skipped {len(self.skipped)} line(s) that are not result rows "
                  f"(line {shown}); the file is left as it is", file=sys.stderr)
        self.done = {row_key(r) for r in self.rows}

    @staticmethod
    def _read(path: Path) -> bytes:
        """A store file's bytes, uncompressed; ``ValueError`` naming the file if it is not a readable store."""
        if path.is_dir():
            raise UsageError(f"{path}: is a directory, not a result store; move it away or use another --out")
        raw = path.read_bytes()
        if path.suffix != ".gz":
            return raw
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError) as error:  # not gzip, or cut short
            raise UsageError(f"{path}: not a complete gzip file ({error}); restore it from version control") \
                from None

    def _unpack(self) -> None:
        """Resume the committed store: its rows copied to ``live`` (whole or not at all), the ``.gz`` kept."""
        with atomic_path(self.live) as scratch:
            with scratch.open("wb") as f:
                f.write(self._read(self.path))
                f.flush()
                os.fsync(f.fileno())
        print(f"note: {self.path} is resumed: its rows are copied to {self.live}, where new rows are appended (the "
              ".gz is left as it is)", file=sys.stderr)
        self.path = self.live

    def problems(self) -> list[str]:
        """What is wrong with this store's rows (:func:`row_problem`), as ``file:line: problem``."""
        return verify_rows(self.rows, lambda index: f"{self.path}:{self.line_numbers[index]}")

    def check_rows(self) -> None:
        """``ValueError`` listing the first bad rows by file and line, so that no report shows them."""
        problems = self.problems()
        if problems:
            shown = "; ".join(problems[:5]) + (f"; … ({len(problems) - 5} more)" if len(problems) > 5 else "")
            raise UsageError(f"{len(problems)} row(s) are not valid results: {shown}")

    def _acquire(self) -> None:
        check_place(Output(self.directory, "--out"))  # the one output policy, for a library caller too
        self.directory.mkdir(parents=True, exist_ok=True)
        handle = (self.directory / ".lock").open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            owner = handle.read().strip() or "unknown"
            handle.close()
            raise UsageError(f"{self.directory} is being written by another process (pid {owner}); wait for it to "
                             "finish or write to another --out") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._lock = handle

    def close(self) -> None:
        """Release the writer's lock (also released when the process ends)."""
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def check_model(self, model: str, identity: dict) -> None:
        """Refuse to add results of ``model`` to a store that holds results of another version of it (other
        weights, config or tokenizer: ``identity`` is :meth:`pretrained.loading.ModelIdentity.row_fields`), naming
        what differs. Other derived artifacts are no refusal: rows key and group by them, so they never mix.
        Rows written before the model's parts were recorded fingerprinted it another way and are not compared."""
        same_name = [r for r in self.rows if r["model"] == model and isinstance(r.get("model_parts"), dict)]
        other = next((r for r in same_name if r["weights"] != identity["weights"]), None)
        if other is not None:
            differ = [part for part, value in identity["model_parts"].items()
                      if other["model_parts"].get(part) != value]
            raise UsageError(f"{self.path} holds results of model {model!r} with other {' and '.join(differ)} "
                             f"(fingerprint {other['weights']}, this one is {identity['weights']}); "
                             "write to a new --out directory")
        artifacts = sorted({str(r.get("artifacts")) for r in same_name} - {identity["artifacts"]})
        if artifacts:
            print(f"note: {self.path} holds results of model {model!r} with other artifacts (gatesight/, "
                  f"calibration/: {', '.join(artifacts)}; this one's are {identity['artifacts']}); rows record "
                  "their artifacts, so the two are never mixed", file=sys.stderr)

    def check_schema(self) -> None:
        """Refuse a store with rows written before the fidelity metrics (schema < 2): never mix the two."""
        old = sum(1 for r in self.rows if r.get("schema", 1) < SCHEMA)
        if old:
            raise UsageError(f"{self.path} holds {old} row(s) written before the fidelity metrics "
                             f"({', '.join(FIDELITY_FIELDS)}) existed; they cannot be compared with new rows. "
                             "Write to a new --out directory (and rerun the old settings there)")

    def has(self, key: tuple) -> bool:
        return key in self.done

    def append(self, row: dict) -> None:
        if self._lock is None:
            raise RuntimeError("this store was opened read-only")
        key = row_key(row)
        if key in self.done:
            return
        if self.path != self.live:
            self._unpack()
        with self.path.open("ab") as f:
            if f.tell() > 0:
                # make sure a previous partial line cannot swallow this row
                with self.path.open("rb") as check:
                    check.seek(-1, os.SEEK_END)
                    if check.read(1) != b"\n":
                        f.write(b"\n")
            f.write((json.dumps(row) + "\n").encode())
            f.flush()
            os.fsync(f.fileno())
        self.rows.append(row)
        self.line_numbers.append(self._next_line)
        self._next_line += 1
        self.done.add(key)

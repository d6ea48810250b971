"""Append-only JSONL result store: one row per answered question, keyed by every setting that produced it.

A killed run resumes where it stopped: finished keys are skipped, a half-written last line is ignored, and
nothing already written is ever rewritten. One writer at a time holds the store's lock; lines that are not rows
are skipped with one warning naming the file and lines.
"""

from __future__ import annotations

import ast
import fcntl
import gzip
import hashlib
import json
import math
import os
import sys
from collections import defaultdict
from pathlib import Path

from runtime.errors import UsageError

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


def check_writable(directory: Path) -> None:
    """``ValueError`` unless ``directory`` is a directory, or can be created, and can be written."""
    directory = Path(directory)
    existing = directory
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"--out {directory}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--out {directory}: {existing} is not writable")


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


def row_problem(row: dict) -> str | None:
    """What is wrong with one row, or None: every key and fidelity field present; score (and score_official) a
    number in [0, 1]; keep_fraction in (0, 1]; answer_nll and delta_nll finite numbers; kl a finite number >= 0; agree a
    boolean; the context's counts within its size (:func:`_count_problem`); and a no-prune row — the full cache
    compared with itself — at exactly zero ΔNLL and KL, agreeing."""
    missing = [f for f in (*KEY_FIELDS, "score", *FIDELITY_FIELDS) if row.get(f) is None and f not in OPTIONAL_FIELDS]
    if missing:
        return f"missing {', '.join(missing)}"
    checks = [("score", lambda v: _number(v) and 0 <= v <= 1, "a number in [0, 1]"),
              ("score_official", lambda v: v is None or (_number(v) and 0 <= v <= 1), "a number in [0, 1]"),
              ("keep_fraction", lambda v: _number(v) and 0 < v <= 1, "a number in (0, 1]"),
              ("answer_nll", _number, "a finite number"),
              ("delta_nll", _number, "a finite number"),
              ("kl", lambda v: _number(v) and v >= -KL_TOLERANCE, "a finite number >= 0"),
              ("agree", lambda v: isinstance(v, bool), "true or false")]
    for field, valid, allowed in checks:
        if not valid(row.get(field)):
            return f"{field}={row.get(field)!r} (expected {allowed})"
    counts = _count_problem(row)
    if counts:
        return counts
    if row["press"] == BASELINE and (row["delta_nll"] != 0 or row["kl"] != 0 or row["agree"] is not True):
        return (f"the no-prune row has delta_nll={row['delta_nll']}, kl={row['kl']}, agree={row['agree']} "
                "(expected exactly 0, 0, true)")
    return None


def _same_values(a: dict, b: dict) -> bool:
    # the timings of one context are measured where it ran: two copies of a row may differ in them alone
    def values(row: dict) -> dict:
        return {k: v for k, v in row.items() if not k.endswith("_seconds")}
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
    """``results.jsonl`` under ``directory`` (readers also take ``results.jsonl.gz``, e.g. a committed store).

    Parameters
    ----------
    directory : path
    readonly : bool
        Readers (reports) take no lock; a writer takes an exclusive lock at once and keeps it while it lives,
        so that a second writer on the same directory is refused instead of duplicating rows.
    """

    def __init__(self, directory, readonly: bool = False):
        self.directory = Path(directory)
        self.path = self.directory / "results.jsonl"
        self.rows: list[dict] = []
        self.line_numbers: list[int] = []
        """The file's line of each row."""
        self.skipped: list[int] = []
        self.cut_line: int | None = None
        """The last line, if it is cut short (a run killed while writing it: a rerun resumes past it)."""
        self._lock = None
        if not readonly:
            self._acquire()
        packed = self.path.with_suffix(".jsonl.gz")
        if readonly and not self.path.exists() and packed.exists():  # a committed, compressed store
            self.path = packed
        if self.path.exists():
            lines = self._read().split(b"\n")
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
        if self.skipped:
            shown = ", ".join(map(str, self.skipped[:10])) + (" …" if len(self.skipped) > 10 else "")
            print(f"warning: {self.path}: skipped {len(self.skipped)} line(s) that are not result rows "
                  f"(line {shown}); the file is left as it is", file=sys.stderr)
        self.done = {row_key(r) for r in self.rows}

    def _read(self) -> bytes:
        """The store's bytes, uncompressed; ``ValueError`` naming the file if it is not a readable store."""
        if self.path.is_dir():
            raise UsageError(f"{self.path}: is a directory, not a result store; move it away or use another --out")
        raw = self.path.read_bytes()
        if self.path.suffix != ".gz":
            return raw
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError) as error:  # not gzip, or cut short
            raise UsageError(f"{self.path}: not a complete gzip file ({error}); restore it from version control") \
                from None

    def problems(self) -> list[str]:
        """What is wrong with this store's rows (:func:`row_problem`), as ``file:line: problem``."""
        return verify_rows(self.rows, lambda index: f"{self.path}:{self.line_numbers[index]}")

    def check_rows(self) -> None:
        """``ValueError`` listing the first bad rows by file and line, so that no report shows them."""
        problems = self.problems()
        if problems:
            shown = "; ".join(problems[:5]) + (f"; … ({len(problems) - 5} more)" if len(problems) > 5 else "")
            raise UsageError(f"{len(problems)} row(s) are not valid results: {shown}")

    def check_complete(self) -> None:
        """``ValueError`` naming what the store lacks: its last line cut short, or a context without the rows of
        every method and question of its run (the methods of its setting group, :data:`SHARED_FIELDS`), so that no
        merge or leaderboard takes an unfinished run for a finished one."""
        rerun = "its bench compare stopped before finishing; rerun it (it resumes)"
        if self.cut_line is not None:
            raise UsageError(f"{self.path}: line {self.cut_line}, the last, is cut short: {rerun}")
        contexts: dict[tuple, set] = defaultdict(set)
        methods: dict[tuple, set] = defaultdict(set)
        for row in self.rows:
            group = tuple(str(row.get(field)) for field in SHARED_FIELDS)
            contexts[(group, row["task"], row.get("haystack"), row["item"])].add((method_at(row), row["question"]))
            methods[group].add(method_at(row))
        for (group, task, _, item), held in contexts.items():
            questions = {question for _, question in held}
            missing = {(method, question) for method in methods[group] for question in questions} - held
            if missing:
                raise UsageError(f"{self.path} is incomplete: task {task}, item {item} lacks the rows of "
                                 f"{listed(f'{method} question {q}' for method, q in missing)}; {rerun}")

    def _acquire(self) -> None:
        check_writable(self.directory)
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
        self.done.add(key)

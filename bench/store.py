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
import os
import sys
from pathlib import Path

KEY_FIELDS = ("model", "weights", "press", "allocator", "ratio", "task", "profile", "length", "item", "question",
              "seed", "code", "engine")
GROUP_FIELDS = ("model", "weights", "profile", "length", "code", "engine")
"""Rows are averaged only within one group of these settings."""
BASELINE = "none"
"""The no-prune method's name in rows (its press and its allocator)."""
SCHEMA = 2
"""Version of a row's fields; 2 added the fidelity metrics (answer_nll, delta_nll, kl, agree)."""
FIDELITY_FIELDS = ("answer_nll", "delta_nll", "kl", "agree")

ROOT = Path(__file__).resolve().parent.parent
RESULT_SOURCES = ("runtime", "presses", "allocators", "bench/compare.py", "bench/fidelity.py", "bench/metrics.py",
                  "bench/scbench_metrics.py", "bench/tasks", "bench/loading.py", "bench/corpus.py")
"""The modules whose code decides a row's values. Reporting, the CLI, the store itself and training code are not
among them, so editing those does not invalidate a store."""


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


def code_version() -> str:
    """Hash of the result-producing modules (:data:`RESULT_SOURCES`), docstrings and comments ignored."""
    digest = hashlib.sha256()
    for source in RESULT_SOURCES:
        target = ROOT / source
        for path in sorted(target.rglob("*.py")) if target.is_dir() else [target]:
            digest.update(path.relative_to(ROOT).as_posix().encode())
            digest.update(_normalised_source(path))
    return digest.hexdigest()[:12]


def row_key(row: dict) -> tuple:
    return tuple(row.get(field) for field in KEY_FIELDS)


def _is_row(value) -> bool:
    return isinstance(value, dict) and all(f in value for f in ("model", "press", "allocator", "ratio", "task", "item"))


def check_writable(directory: Path) -> None:
    """``ValueError`` unless ``directory`` is a directory, or can be created, and can be written."""
    directory = Path(directory)
    existing = directory
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"--out {directory}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--out {directory}: {existing} is not writable")


def verify_rows(rows: list[dict]) -> list[str]:
    """What is wrong with ``rows`` (empty if nothing): every row complete with the fidelity fields, and the
    no-prune rows — the full cache compared with itself — at exactly zero ΔNLL and KL, agreeing with themselves."""
    problems = []
    for number, row in enumerate(rows, start=1):
        missing = [f for f in (*KEY_FIELDS, "score", *FIDELITY_FIELDS) if row.get(f) is None]
        if missing:
            problems.append(f"row {number}: missing {', '.join(missing)}")
        elif row["press"] == BASELINE and (row["delta_nll"] != 0 or row["kl"] != 0 or row["agree"] is not True):
            problems.append(f"row {number}: the no-prune row has delta_nll={row['delta_nll']}, kl={row['kl']}, "
                            f"agree={row['agree']} (expected exactly 0, 0, true)")
    return problems


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
        self.skipped: list[int] = []
        self._lock = None
        if not readonly:
            self._acquire()
        packed = self.path.with_suffix(".jsonl.gz")
        if readonly and not self.path.exists() and packed.exists():  # a committed, compressed store
            self.path = packed
        if self.path.exists():
            raw_bytes = self.path.read_bytes()
            lines = (gzip.decompress(raw_bytes) if self.path.suffix == ".gz" else raw_bytes).split(b"\n")
            for number, raw in enumerate(lines, start=1):
                if not raw.strip():
                    continue
                try:
                    value = json.loads(raw.decode("utf-8"))
                except (UnicodeDecodeError, json.JSONDecodeError):
                    value = None
                if _is_row(value):
                    # rows written before the engine field existed all came from the HF runtime, the only engine
                    value.setdefault("engine", "hf")
                    self.rows.append(value)
                elif not (number == len(lines) and not raw.endswith(b"}")):  # a last line cut by a kill is normal
                    self.skipped.append(number)
        if self.skipped:
            shown = ", ".join(map(str, self.skipped[:10])) + (" …" if len(self.skipped) > 10 else "")
            print(f"warning: {self.path}: skipped {len(self.skipped)} line(s) that are not result rows "
                  f"(line {shown}); the file is left as it is", file=sys.stderr)
        self.done = {row_key(r) for r in self.rows}

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
            raise ValueError(f"{self.directory} is being written by another process (pid {owner}); wait for it to "
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

    def check_model(self, model: str, weights: str) -> None:
        """Refuse to add results of ``model`` to a store that holds results of another version of it."""
        other = {r.get("weights") for r in self.rows if r["model"] == model} - {weights}
        if other:
            raise ValueError(f"{self.path} holds results of model {model!r} with other weights (fingerprint "
                             f"{', '.join(str(w) for w in sorted(other, key=str))}, this one is {weights}); "
                             "write to a new --out directory")

    def check_schema(self) -> None:
        """Refuse a store with rows written before the fidelity metrics (schema < 2): never mix the two."""
        old = sum(1 for r in self.rows if r.get("schema", 1) < SCHEMA)
        if old:
            raise ValueError(f"{self.path} holds {old} row(s) written before the fidelity metrics "
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

"""Append-only JSONL result store: one row per answered question, keyed by every setting that produced it.

A killed run resumes where it stopped: finished keys are skipped, a half-written last line is ignored, and
nothing already written is ever rewritten.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

KEY_FIELDS = ("model", "weights", "press", "allocator", "ratio", "task", "profile", "length", "item", "question", "seed", "code")

_PACKAGES = ("runtime", "presses", "allocators", "bench")


def code_version() -> str:
    """Content hash of the project's Python sources: results from different code never mix."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for package in _PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def row_key(row: dict) -> tuple:
    return tuple(row.get(field) for field in KEY_FIELDS)


class ResultStore:
    """``results.jsonl`` under ``directory``."""

    def __init__(self, directory):
        self.directory = Path(directory)
        self.path = self.directory / "results.jsonl"
        self.rows: list[dict] = []
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    self.rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a line cut by a kill: its question is simply answered again
        self.done = {row_key(r) for r in self.rows}

    def check_model(self, model: str, weights: str) -> None:
        """Refuse to add results of ``model`` to a store that holds results of another version of it."""
        other = {r.get("weights") for r in self.rows if r["model"] == model} - {weights}
        if other:
            raise ValueError(f"{self.path} holds results of model {model!r} with other weights (fingerprint "
                             f"{', '.join(str(w) for w in sorted(other, key=str))}, this one is {weights}); "
                             "write to a new --out directory")

    def has(self, key: tuple) -> bool:
        return key in self.done

    def append(self, row: dict) -> None:
        key = row_key(row)
        if key in self.done:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            if f.tell() > 0:
                # make sure a previous partial line cannot swallow this row
                with self.path.open("rb") as check:
                    check.seek(-1, os.SEEK_END)
                    if check.read(1) != b"\n":
                        f.write("\n")
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.rows.append(row)
        self.done.add(key)

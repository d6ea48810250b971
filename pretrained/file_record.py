"""The record a model folder keeps of its own files (:data:`RECORD_FILE`): every file that makes the model, with its
size and SHA-256, so that a folder changed in place (4 KiB of its weights overwritten, its size unchanged) is never
run under its name (:func:`pretrained.model_cache.check_recorded` checks it before a run, as it checks a conversion's
``source.json``).

The folders the checkout ships — the default model (``models/hybrid-byte-12l``) and the distilled hybrid's delta
(``models/smollm2-135m-hybrid``) — commit theirs; a model ``bench train-model`` trains and a delta ``bench distill``
writes get one as they are written. The artifacts beside a model (``gatesight/``, ``calibration/``) are not in it:
``bench train`` and ``bench calibrate`` replace them in place, their loaders check what they hold, and every row
records their own fingerprint.

``python -m pretrained.file_record FOLDER …`` writes the record of each folder anew (after a deliberate change).
"""

from __future__ import annotations

import hashlib
import json
import sys
from functools import lru_cache
from pathlib import Path

from runtime.errors import UsageError

from .model_files import part_files

RECORD_FILE = "files.json"
"""A model folder's record of its own files: ``{"files": {name: {"size": bytes, "sha256": hex}}}``."""
DELTA_FILES = ("hybrid.json", "mixers.safetensors")
"""What makes a distilled hybrid's delta (:mod:`hybridmodel.hybrid_delta`): its manifest and its mixers."""


@lru_cache(maxsize=64)
def _file_sha256(path: Path, inode: int, size: int, mtime_ns: int, ctime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_of(path: Path) -> str:
    """SHA-256 of a file, once per state of it (its inode, size, modification and change times: a rewrite in place
    that keeps size and modification time, ``touch -r``, still moves the change time), as the weights' digest is
    (:func:`presses.calibration.weights_fingerprint`): a model checked before every run costs a ``stat`` after the
    first."""
    stat = Path(path).stat()
    return _file_sha256(Path(path), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def recorded_files(directory: Path) -> list[Path]:
    """The files that make the model of ``directory``: a model directory's parts (weights, config, tokenizer:
    :data:`~pretrained.model_files.MODEL_PARTS`), or a delta's :data:`DELTA_FILES`."""
    directory = Path(directory)
    if (directory / "config.json").is_file():
        return sorted({path for part in ("weights", "config", "tokenizer") for path in part_files(directory, part)})
    return [directory / name for name in DELTA_FILES if (directory / name).is_file()]


def write_record(directory: Path) -> Path:
    """Write the :data:`RECORD_FILE` of ``directory`` (:func:`recorded_files`, each file's size and SHA-256); its
    path."""
    directory = Path(directory)
    files = {path.relative_to(directory).as_posix(): {"size": path.stat().st_size, "sha256": sha256_of(path)}
             for path in recorded_files(directory)}
    (directory / RECORD_FILE).write_text(json.dumps({"files": files}, indent=2) + "\n")
    return directory / RECORD_FILE


def read_record(directory: Path) -> dict | None:
    """The ``files`` of ``directory``'s :data:`RECORD_FILE`; None where it keeps none. A record that is no such JSON
    is a :class:`~runtime.errors.UsageError` naming it (a damaged record checks nothing: never taken for none)."""
    path = Path(directory) / RECORD_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        files = record["files"]
        if not all(isinstance(r, dict) and isinstance(r.get("size"), int) and isinstance(r.get("sha256"), str)
                   for r in files.values()):
            raise TypeError
    except (ValueError, TypeError, KeyError, AttributeError):
        raise UsageError(f"{path} is not a record of the model's files ({{\"files\": {{name: {{\"size\", "
                         "\"sha256\"}}}}); restore it with the folder's files") from None
    return files


if __name__ == "__main__":
    for folder in sys.argv[1:]:
        print(f"wrote {write_record(Path(folder))}")

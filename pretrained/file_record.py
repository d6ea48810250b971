"""The record a model folder keeps of its own files (:data:`RECORD_FILE`): every file that makes the model, with its
size and SHA-256, so that a folder changed in place (4 KiB of its weights overwritten, its size unchanged) is never
run under its name (:func:`pretrained.model_cache.check_recorded` checks it before a run, as it checks a conversion's
``source.json``).

The folders the checkout ships — the default model (``models/hybrid-byte-12l``) and the distilled hybrid's delta
(``models/smollm2-135m-hybrid``) — commit theirs; a model ``bench train-model`` trains and a delta ``bench distill``
writes get one as they are written. The record holds the artifacts beside the model too (``gatesight/``,
``calibration/``): the bench's commands that put one in place in a recorded folder (``bench train``, ``bench
calibrate``, ``bench calibrate-shares``, ``bench ship-artifacts``) write the record again (:func:`record_again`), so
an artifact changed by hand (4 KiB of an estimator zeroed: finite values its loader takes) is refused as the weights
are.

``python -m pretrained.file_record FOLDER …`` writes the record of each folder anew (after a deliberate change).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from runtime.bounded_read import METADATA_LIMIT, read_bounded
from runtime.errors import UsageError
from runtime.json_text import parse_json

from .file_reads import sha256_of
from .model_files import ARTIFACTS, METHOD_ARTIFACTS, matching_files, part_files

RECORD_FILE = "files.json"
"""A model folder's record of its own files: ``{"files": {name: {"size": bytes, "sha256": hex}}}``."""
CHECKOUT = Path(__file__).resolve().parents[1]
"""The source checkout: a recorded folder in it (``models/…``) is restored by git."""
SHIPPED = ("models/hybrid-byte-12l", "models/smollm2-135m-hybrid")
"""The folders of the checkout that ship their record: without it (removed, emptied, made a folder or a link) they
are refused, never trusted as a folder that records nothing."""
DELTA_FILES = ("hybrid.json", "mixers.safetensors")
"""What makes a distilled hybrid's delta (:mod:`hybridmodel.hybrid_delta`): its manifest and its mixers."""


def model_files(directory: Path) -> list[Path]:
    """The files that make the model of ``directory``: a model directory's parts (weights, config, tokenizer:
    :data:`~pretrained.model_files.MODEL_PARTS`), or a delta's :data:`DELTA_FILES`."""
    directory = Path(directory)
    if (directory / "config.json").is_file():
        return sorted({path for part in ("weights", "config", "tokenizer") for path in part_files(directory, part)})
    return [directory / name for name in DELTA_FILES if (directory / name).is_file()]


def recorded_files(directory: Path) -> list[Path]:
    """What a folder's record holds: the files that make its model (:func:`model_files`) and the artifacts the bench
    keeps beside them (:data:`~pretrained.model_files.ARTIFACTS`, :data:`~pretrained.model_files.METHOD_ARTIFACTS`)."""
    artifacts = matching_files(Path(directory), (*ARTIFACTS, *METHOD_ARTIFACTS))
    return sorted({*model_files(directory), *artifacts})


def record_again(directory: Path) -> None:
    """Write ``directory``'s record anew where it keeps one: a command of the bench has just put an artifact of its
    own in place there (a record left as it was would refuse the folder as changed by hand)."""
    if (Path(directory) / RECORD_FILE).is_file():
        write_record(directory)


def write_record(directory: Path) -> Path:
    """Write the :data:`RECORD_FILE` of ``directory`` (:func:`recorded_files`, each file's size and SHA-256); its
    path."""
    directory = Path(directory)
    files = {path.relative_to(directory).as_posix(): {"size": path.stat().st_size, "sha256": sha256_of(path)}
             for path in recorded_files(directory)}
    (directory / RECORD_FILE).write_text(json.dumps({"files": files}, indent=2) + "\n")
    return directory / RECORD_FILE


def restore_hint(directory: Path) -> str:
    """How a recorded folder is restored: from the checkout where it ships in it, else from where it came."""
    try:
        shipped = Path(directory).resolve().relative_to(CHECKOUT.resolve())
    except ValueError:
        return "restore it from where it was copied (or write it again with the command that made it)"
    return f"run `git checkout -- {shipped.as_posix()}` to restore the files the checkout ships"


def _ships_record(directory: Path) -> bool:
    """Whether ``directory`` is one of the checkout's :data:`SHIPPED` folders."""
    return Path(directory).resolve() in {(CHECKOUT / folder).resolve() for folder in SHIPPED}


def read_record(directory: Path) -> dict | None:
    """The ``files`` of ``directory``'s :data:`RECORD_FILE`; None where it keeps none (and is not one of the
    :data:`SHIPPED` folders). A record that is a link, a folder or no such JSON, or that leaves out a file that makes
    the model (:func:`recorded_files`), is a :class:`~runtime.errors.UsageError` naming it: a damaged record checks
    nothing, and is never taken for none."""
    directory = Path(directory)
    path = directory / RECORD_FILE
    damaged = f"{path} is not a record of the model's files ({{\"files\": {{name: {{\"size\", \"sha256\"}}}}}}"
    if path.is_symlink() or (path.exists() and not path.is_file()):
        kind = "a link" if path.is_symlink() else "a folder" if path.is_dir() else "not a regular file"
        raise UsageError(f"{path} is {kind}, where the record of the model's files belongs; "
                         f"{restore_hint(directory)}")
    if not path.exists():
        if _ships_record(directory):
            raise UsageError(f"{path} is missing: the checkout ships this folder with the record of its files; "
                             f"{restore_hint(directory)}")
        return None
    text = read_bounded(path, METADATA_LIMIT, restore_hint(directory))
    try:
        record = parse_json(text.decode())
        files = record["files"]
        if not all(isinstance(r, dict) and isinstance(r.get("size"), int) and isinstance(r.get("sha256"), str)
                   for r in files.values()):
            raise TypeError
    except (ValueError, TypeError, KeyError, AttributeError):
        raise UsageError(f"{damaged}); {restore_hint(directory)}") from None
    unrecorded = [p.relative_to(directory).as_posix() for p in recorded_files(directory)
                  if p.relative_to(directory).as_posix() not in files]
    if unrecorded:
        raise UsageError(f"{path} does not record {unrecorded[0]}, a file that makes the model; "
                         f"{restore_hint(directory)}")
    return files


if __name__ == "__main__":
    for folder in sys.argv[1:]:
        print(f"wrote {write_record(Path(folder))}")

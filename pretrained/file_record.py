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

import fnmatch
import json
import sys
from pathlib import Path

from artifacts.files import write_text
from runtime.bounded_read import METADATA_LIMIT, read_bounded
from runtime.errors import UsageError
from runtime.json_text import parse_json

from .file_reads import sha256_of
from .model_files import ARTIFACTS, METHOD_ARTIFACTS, matching_files, part_files

RECORD_FILE = "files.json"
"""A model folder's record of its own files: ``{"files": {name: {"size": bytes, "sha256": hex}}}``."""
SOURCE_FILE = "source.json"
"""Written last into a converted directory: which file it was made from, and the size and SHA-256 of every file the
conversion wrote (``files``: :func:`pretrained.model_cache.file_records`); a directory without it is incomplete."""
ARTIFACT_RECORD = "artifacts"
"""The key of a conversion's :data:`SOURCE_FILE` that records the artifacts beside the model as a bench command last
wrote them (``{name: {"size", "sha256"}}``): a rebuilt hybrid's start as its delta ships them, until one is replaced."""
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
    own in place there (a record left as it was would refuse the folder as changed by hand). Only the artifacts are
    recorded anew: the files that make the model keep their recorded size and SHA-256, and each must still have them.
    One changed while the command ran (weights overwritten during calibrate-shares were recorded as the folder's own,
    probe 10) is a :class:`~runtime.errors.UsageError` naming it, and nothing is recorded: the folder is then refused
    as damaged until it is restored, never run under its name with other weights."""
    directory = Path(directory)
    _record_conversion_artifacts(directory)
    if not (directory / RECORD_FILE).is_file():
        return
    old = _recorded_files(directory)
    made = [path.relative_to(directory).as_posix() for path in model_files(directory)]
    gone = [name for name in old if not _is_artifact(name) and name not in made]
    for name in gone + made:
        path, was = directory / name, old.get(name)
        now = {"size": path.stat().st_size, "sha256": sha256_of(path)} if path.is_file() else None
        if now != (None if was is None else {"size": was["size"], "sha256": was["sha256"]}):
            how = ("is gone" if now is None else "was not recorded" if was is None else
                   f"has SHA-256 {now['sha256']}, not the recorded {was['sha256']}")
            raise UsageError(f"{directory}: {name} changed while the command ran ({how}): what it wrote was made from "
                             "other files than those recorded, so the record is not written again; "
                             f"{restore_hint(directory)}, then run the command again")
    write_record(directory, {name: old[name] for name in made})


def _record_conversion_artifacts(directory: Path) -> None:
    """Record anew, in the :data:`SOURCE_FILE` of a converted directory, the artifacts beside its model
    (:data:`ARTIFACT_RECORD`): their record is checked as the weights are (:func:`pretrained.model_cache.
    check_recorded`), so an artifact a bench command has just replaced must be recorded, and one changed by hand is
    refused. A record that cannot be read is left as it is: the next run names it."""
    path = directory / SOURCE_FILE
    if path.is_symlink() or not path.is_file():
        return
    source = parse_json(read_bounded(path, METADATA_LIMIT, "convert it again"))
    if not isinstance(source, dict):
        return
    artifacts = {each.relative_to(directory).as_posix(): {"size": each.stat().st_size, "sha256": sha256_of(each)}
                 for each in matching_files(directory, (*ARTIFACTS, *METHOD_ARTIFACTS))}
    write_text(path, json.dumps({**source, ARTIFACT_RECORD: artifacts}, indent=2) + "\n")


def _is_artifact(name: str) -> bool:
    """Whether the recorded ``name`` is an artifact the bench keeps beside the model (recorded anew by the command
    that writes it), not a file that makes the model."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in (*ARTIFACTS, *METHOD_ARTIFACTS))


def write_record(directory: Path, kept: dict | None = None) -> Path:
    """Write the :data:`RECORD_FILE` of ``directory`` (:func:`recorded_files`, each file's size and SHA-256; ``kept``:
    entries of an earlier record to write as they are, checked by the caller); its path."""
    directory = Path(directory)
    kept = kept or {}
    files = {name: kept.get(name) or {"size": path.stat().st_size, "sha256": sha256_of(path)}
             for name, path in ((path.relative_to(directory).as_posix(), path) for path in recorded_files(directory))}
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
    if path.is_symlink() or (path.exists() and not path.is_file()):
        kind = "a link" if path.is_symlink() else "a folder" if path.is_dir() else "not a regular file"
        raise UsageError(f"{path} is {kind}, where the record of the model's files belongs; "
                         f"{restore_hint(directory)}")
    if not path.exists():
        if _ships_record(directory):
            raise UsageError(f"{path} is missing: the checkout ships this folder with the record of its files; "
                             f"{restore_hint(directory)}")
        return None
    files = _recorded_files(directory)
    unrecorded = [p.relative_to(directory).as_posix() for p in recorded_files(directory)
                  if p.relative_to(directory).as_posix() not in files]
    if unrecorded:
        raise UsageError(f"{path} does not record {unrecorded[0]}, a file that makes the model; "
                         f"{restore_hint(directory)}")
    return files


def _recorded_files(directory: Path) -> dict:
    """The ``files`` of ``directory``'s :data:`RECORD_FILE`, a regular file; a :class:`~runtime.errors.UsageError`
    naming it where it is no such JSON."""
    path = directory / RECORD_FILE
    damaged = f"{path} is not a record of the model's files ({{\"files\": {{name: {{\"size\", \"sha256\"}}}}}}"
    text = read_bounded(path, METADATA_LIMIT, restore_hint(directory))
    try:
        record = parse_json(text.decode())
        files = record["files"]
        if not all(isinstance(r, dict) and isinstance(r.get("size"), int) and isinstance(r.get("sha256"), str)
                   for r in files.values()):
            raise TypeError
    except (ValueError, TypeError, KeyError, AttributeError):
        raise UsageError(f"{damaged}); {restore_hint(directory)}") from None
    return files


if __name__ == "__main__":
    for folder in sys.argv[1:]:
        print(f"wrote {write_record(Path(folder))}")

"""Fingerprints of a model directory: what a result row records of the model it came from (its parts' and its
artifacts' content hashes, :class:`ModelIdentity`), and the weights' own (:func:`weights_fingerprint`) that a
calibration, an estimator and label shards record. The weights are hashed once a process for each state of their
files (:func:`weights_digest`): a press binds on every context it scores."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from runtime.bounded_read import METADATA_LIMIT, TOKENIZER_LIMIT, read_bounded

from .file_reads import file_state, read_whole
from .model_files import ARTIFACTS, METHOD_ARTIFACTS, MODEL_PARTS, check_safetensors_bytes, matching_files, part_files

PART_LIMITS = {"config": METADATA_LIMIT, "tokenizer": TOKENIZER_LIMIT}
"""The most bytes each file of a model's small parts may hold (:mod:`runtime.bounded_read`): its settings, and its
tokenizer's vocabulary, settings and chat template."""


def _digest(directory: Path, paths, read: Callable[[Path], bytes] = Path.read_bytes) -> str:
    """The content hash of ``paths`` with their names relative to ``directory``; ``read``: each file's bytes (a
    caller that holds some already gives them, so that no file is read twice)."""
    digest = hashlib.sha256()
    for path in paths:  # a shard an index names may lie outside the directory (``../``)
        digest.update(Path(os.path.relpath(path, directory)).as_posix().encode())
        digest.update(read(path))
    return digest.hexdigest()[:12]


def file_states(paths: Iterable[Path]) -> tuple[tuple, ...]:
    """Each file's state (:func:`~pretrained.file_reads.file_state`): equal states are taken for equal contents."""
    return tuple(file_state(path) for path in paths)


def weights_digest(directory: Path, paths: list[Path]) -> str:
    """The content hash of the weight files ``paths`` of ``directory`` (:func:`part_files`), computed once a process
    for each state of them (:func:`file_states`); a safetensors file that is cut is a ``UsageError`` naming it,
    found as its bytes are read (the loader then need not open it to check)."""
    return _weights_digest(Path(directory), tuple(paths), file_states(paths))


@functools.lru_cache(maxsize=16)
def _weights_digest(directory: Path, paths: tuple[Path, ...], states: tuple) -> str:
    # ``states`` is the key alone: a press binds on every context it scores (presses.preparation.prepare), and
    # hashing half a gigabyte of weights each time cost SmolLM2's hybrid 0.5 s a context, 25 times GateSight's own
    # scoring
    def read(path: Path) -> bytes:
        data = read_whole(path, None)  # its SHA-256 kept: the model's file record checks it without a second read
        if path.suffix == ".safetensors":
            check_safetensors_bytes(path, data)
        return data

    return _digest(directory, paths, read)


def weights_fingerprint(model_dir, config: dict | None = None) -> str | None:
    """The content hash of ``model_dir``'s weight files (safetensors or PyTorch's, the bench's own files aside;
    ``config``: its config as read, or None to read it), or None where there is no directory or it holds none (a
    model built in memory): what a calibration or an estimator was measured on."""
    paths = part_files(model_dir, "weights", config) if model_dir is not None else []
    return weights_digest(Path(model_dir), paths) if paths else None


def fingerprint_of_parts(parts: dict) -> str:
    """The one fingerprint of a model's parts ``{part: fingerprint}``: what a row records as ``weights`` beside its
    ``model_parts``, and what a reader checks it against."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class ModelIdentity:
    """Fingerprints of a model directory.

    Attributes
    ----------
    parts : dict
        ``{part: fingerprint}`` of the weights, config and tokenizer (:data:`MODEL_PARTS`).
    artifacts : str
        One fingerprint of what the bench derived and stores beside them (:data:`ARTIFACTS`).
    """

    parts: dict
    artifacts: str

    @property
    def weights(self) -> str:
        """One fingerprint of every part (weights, config and tokenizer; not the ``weights`` part's alone): a row's
        ``weights`` field (:func:`fingerprint_of_parts`)."""
        return fingerprint_of_parts(self.parts)

    def row_fields(self) -> dict:
        """What a result row records of the model it came from (``weights`` and ``artifacts`` are in its key)."""
        return {"weights": self.weights, "model_parts": dict(self.parts), "artifacts": self.artifacts}




def identity(directory: Path, config: dict | None = None, config_bytes: bytes | None = None) -> ModelIdentity:
    """The :class:`ModelIdentity` of a model directory; ``config`` and ``config_bytes``: its ``config.json`` as
    read already (parsed, and its bytes), so that it is not read again."""
    directory = Path(directory)
    config_path = directory / "config.json"

    def reader(part: str) -> Callable[[Path], bytes]:
        def read(path: Path) -> bytes:
            if config_bytes is not None and path == config_path:
                return config_bytes
            return read_bounded(path, PART_LIMITS[part], "copy it again from where the model came from")
        return read

    parts = {part: weights_digest(directory, files) if part == "weights" else _digest(directory, files, reader(part))
             for part, files in ((part, part_files(directory, part, config)) for part in MODEL_PARTS)}
    return ModelIdentity(parts, artifacts_fingerprint(directory))


def artifacts_fingerprint(directory: Path) -> str:
    """:attr:`ModelIdentity.artifacts` alone: what the bench derived and stores beside the model (:data:`ARTIFACTS`),
    less what one method alone reads (:data:`METHOD_ARTIFACTS`)."""
    return _digest(Path(directory), matching_files(Path(directory), ARTIFACTS, exclude=METHOD_ARTIFACTS))


def files_fingerprint(directory: Path, patterns) -> str:
    """Content hash of the files of ``directory`` matching ``patterns`` (globs), with their file names (not their
    folders: a calibration read from ``DIR/calibration/`` or from ``DIR`` as the older layout kept it is one)."""
    digest = hashlib.sha256()
    for path in matching_files(Path(directory), patterns):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def fingerprint(directory: Path, part: str | None = None) -> str:
    """Content hash of a model directory: by default of everything that makes the model (:attr:`ModelIdentity.weights`,
    so that results of a retrained or reconfigured model never pass for the old one's); of one part if given
    (``"weights"``: the weight files alone, safetensors or PyTorch's, what a calibration, an estimator and label
    shards record)."""
    if part is None:
        return identity(directory).weights
    files = part_files(directory, part)
    if part == "weights":
        return weights_digest(Path(directory), files)
    return _digest(Path(directory), files, lambda path: read_bounded(path, PART_LIMITS[part], "copy it again from "
                                                                      "where the model came from"))

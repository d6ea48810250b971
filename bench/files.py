"""Writing the bench's outputs atomically: a reader, or a run killed half way or on a full disk, sees the old file
or the new one, never a part of one."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: Path):
    """A temporary path beside ``path`` to write to; it replaces ``path`` (``os.replace``) when the block ends
    without an error, and is removed otherwise."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp" + path.suffix, dir=path.parent)
    os.close(handle)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(name, 0o666 & ~umask)  # as a plain open() would create it (mkstemp makes it private)
    try:
        yield Path(name)
        os.replace(name, path)
    finally:
        if os.path.exists(name):
            os.unlink(name)


def write_text(path: Path, text: str) -> Path:
    """``path.write_text(text)``, atomically."""
    with atomic_path(path) as scratch:
        scratch.write_text(text)
    return Path(path)

"""The generic-text corpus that exists on every machine of this kind, offline: Python's standard-library sources,
license and copyright texts under ``/usr/share``, and the long descriptions of installed Python packages.

It trains the default model, calibrates TriAttention and the layer gate weights, times scoring (``bench cost``)
and supplies the GateSight labelling windows. Documents are split by a hash of their path: ~10 % are held out.
"""

from __future__ import annotations

import email
import hashlib
import sysconfig
from functools import lru_cache
from pathlib import Path

SOURCES = ("python-stdlib", "licenses", "package-docs")


def _held_out(path: str) -> bool:
    return hashlib.sha256(path.encode()).digest()[0] < 26  # ~10 %


def _source_files(source: str) -> list[Path]:
    if source == "python-stdlib":
        root = Path(sysconfig.get_paths()["stdlib"])
        return sorted(p for p in root.glob("*.py"))
    if source == "licenses":
        return sorted([*Path("/usr/share/common-licenses").glob("*"), *Path("/usr/share/doc").glob("*/copyright")])
    root = Path(sysconfig.get_paths()["purelib"])
    return sorted(root.glob("*.dist-info/METADATA"))


def _read(source: str, path: Path) -> str:
    text = path.read_text(errors="ignore")
    if source == "package-docs":
        text = email.message_from_string(text).get_payload() or ""
    return text.strip()


@lru_cache(maxsize=None)
def documents(source: str, split: str = "train", min_chars: int = 400) -> tuple[tuple[str, str], ...]:
    """``(path, text)`` of every document of ``source`` in ``split`` (``train`` or ``heldout``)."""
    if source not in SOURCES:
        raise ValueError(f"unknown text source {source!r}; choose from {', '.join(SOURCES)}")
    out = []
    for path in _source_files(source):
        if path.is_file() and _held_out(str(path)) == (split == "heldout"):
            text = _read(source, path)
            if len(text) >= min_chars and text.isascii():
                out.append((str(path), text))
    return tuple(out)

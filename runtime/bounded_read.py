"""Reading a file the user can replace (a record, a model's settings, a store) without trusting its size: a 20 GB
file (sparse: it costs no disk) read whole ended a run in ``MemoryError``, or drew the machine's out-of-memory killer
onto another process (probe 10). :func:`read_bounded` refuses a file past its bound before reading it, and reads at
most one byte past the bound, so that a file that grows as it is read, or a device, is bounded too. The bounds sit
well above any real file of each kind: they stop what no tool writes, never a big model's real file."""

import os
from pathlib import Path

from .errors import UsageError

METADATA_LIMIT = 64 << 20
"""Bytes of a JSON record or settings file (head shares, an estimator's settings, carried.json, a conversion's or a
folder's record, a model's config, generation config, tokenizer config and chat template): real ones hold kilobytes
(a tokenizer config with every added token spelled out, a few MB), so 64 MiB is past any a tool writes, and small
enough for Python to parse without the machine's memory."""
TOKENIZER_LIMIT = 512 << 20
"""Bytes of any of a model's tokenizer files (``tokenizer.json``, a vocabulary, merges, a sentencepiece model): the
largest real ones hold tens of MB (Gemma 3's ``tokenizer.json``, 33 MB), so 512 MiB leaves a tenfold margin."""
REPORT_LIMIT = 256 << 20
"""Bytes of a file a command writes for people and then reads back (a store's summary.md and curves.png, a
leaderboard's page, tables and images, the rows of a model evaluation): real ones hold kilobytes to a few MB."""
ARTIFACT_LIMIT = 4 << 30
"""Bytes of a tensor file a model's derived artifact keeps (a GateSight estimator, a calibration), which safetensors
maps whole to open: an estimator holds a small network per attention layer and KV head (SmolLM2-135M's, 1 MB; a
128-layer model of 128 KV heads would hold some 700 MB), a calibration a few statistics per head (kilobytes), so 4
GiB is past any, and a 20 GB file (sparse: it costs no disk) mapped under an address-space limit ended a run in
``MemoryError`` (probe 13)."""


class FileTooLargeError(UsageError):
    """A file past the bound of its kind: a :class:`~runtime.errors.UsageError`, shown as one line; ``reason``: what
    is wrong, without the file's name or the remedy (for a caller that says it in a sentence of its own)."""

    def __init__(self, path, reason: str, remedy: str):
        super().__init__(f"{path}: {reason}; {remedy}")
        self.reason = reason


def _shown(limit: int) -> str:
    for shift, unit in ((30, "GiB"), (20, "MiB")):
        if limit % (1 << shift) == 0:
            return f"{limit >> shift} {unit}"
    return f"{limit:,} bytes"


def check_size(path, limit: int, remedy: str) -> None:
    """:class:`FileTooLargeError` naming ``path``, its size and ``limit`` (bytes) with ``remedy`` where it holds more
    than ``limit`` bytes, said by its size alone: for a file that is mapped rather than read."""
    size = os.stat(path).st_size
    if size > limit:
        raise FileTooLargeError(path, f"holds {size:,} bytes, more than the {_shown(limit)} such a file may hold",
                                remedy)


def read_bounded(path, limit: int, remedy: str) -> bytes:
    """The bytes of ``path``; :class:`FileTooLargeError` naming it, its size and ``limit`` (bytes) with ``remedy``
    (what the user does about it) where it holds more than ``limit`` bytes, said by its size before any read or,
    for a file that grows or a device, found by reading ``limit + 1`` bytes at most."""
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size > limit:
            raise FileTooLargeError(path, f"holds {size:,} bytes, more than the {_shown(limit)} such a file may hold",
                                    remedy)
        data = file.read(limit + 1)
    if len(data) > limit:
        raise FileTooLargeError(path, f"holds more than {_shown(limit)} as it is read (a file that grows, or a device)",
                                remedy)
    return data


def read_text_bounded(path, limit: int, remedy: str) -> str:
    """:func:`read_bounded` decoded as UTF-8, as ``Path.read_text`` reads (``UnicodeDecodeError`` where it is not)."""
    return read_bounded(Path(path), limit, remedy).decode()

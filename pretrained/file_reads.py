"""A model's files read once per state of them.

One run asks several things of the same bytes: a model folder's record (:mod:`pretrained.file_record`) wants each
file's SHA-256, the rows want the weights' fingerprint (:func:`pretrained.fingerprints.weights_digest`), the run's
:class:`~pretrained.model_info.ModelInfo` wants the config. Each is answered from one read of each file: what a read
learns (its SHA-256; a small file's bytes too) is kept under the file's state (:func:`file_state`), and a file whose
state has not moved is not read again. A file of the weights' size is never held, only its hash.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from pathlib import Path

from runtime.bounded_read import METADATA_LIMIT, read_bounded

KEEP_BYTES = 1 << 20
"""Files up to this size keep their bytes with their hash (a config, a tokenizer's settings): read for a hash, they
are not read again to be parsed."""
_HELD: OrderedDict[tuple, tuple[str, bytes | None]] = OrderedDict()
_HOLD = 64


def file_state(path: Path) -> tuple:
    """``(device, inode, size, modification and change times)``: the file whatever path names it, and what a rewrite
    moves, the change time too where it keeps size and modification time (``touch -r``); equal states are taken for
    equal contents."""
    stat = Path(path).stat()
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


def _hold(state: tuple, digest: str, data: bytes | None) -> None:
    _HELD[state] = (digest, data if data is not None and len(data) <= KEEP_BYTES else None)
    _HELD.move_to_end(state)
    while len(_HELD) > _HOLD:
        _HELD.popitem(last=False)


def read_whole(path: Path, limit: int | None = METADATA_LIMIT) -> bytes:
    """The bytes of ``path``: a small file's (:data:`KEEP_BYTES`) from an earlier read of the same state, else read
    now, its SHA-256 kept for :func:`sha256_of`; ``limit``: the most bytes it may hold (a model's settings or
    tokenizer, :mod:`runtime.bounded_read`), or None for weights, whose size the model sets."""
    state = file_state(path)
    held = _HELD.get(state)
    if held is not None and held[1] is not None:
        return held[1]
    if limit is None:
        data = Path(path).read_bytes()
    else:
        data = read_bounded(path, limit, "copy it again from where the model came from")
    _hold(state, hashlib.sha256(data).hexdigest(), data)
    return data


def sha256_of(path: Path) -> str:
    """The SHA-256 of ``path``, read at most once per state of it (by :func:`read_whole` or here, streamed)."""
    state = file_state(path)
    held = _HELD.get(state)
    if held is not None:
        return held[0]
    if state[2] <= KEEP_BYTES:
        read_whole(path)
        return _HELD[state][0]
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    _hold(state, digest.hexdigest(), None)
    return digest.hexdigest()


def forget() -> None:
    """Drop what was learnt (as a fresh process starts)."""
    _HELD.clear()

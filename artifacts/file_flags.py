"""The attributes that keep even root from changing a file (Linux's ``chattr +i`` and ``+a``), found before any work.

A command that runs as root is let through by every permission bit, so only these stop its writes, and they stop
them after the work with a bare ``[Errno 1] Operation not permitted`` (probe 11: a result store's results.jsonl or
summary.md, a model's head_shares.json that ``--replace`` moves aside). :func:`protection` names the attribute so
that the place is refused first, as an unwritable folder is (:mod:`artifacts.outputs`).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

FS_IOC_GETFLAGS = 0x80086601
"""``_IOR('f', 1, long)`` on 64-bit Linux: reads a file's attributes (``lsattr``)."""
IMMUTABLE, APPEND_ONLY = 0x10, 0x20
"""``FS_IMMUTABLE_FL``: no write, rename or removal; ``FS_APPEND_FL``: appends alone (no rename, removal or cut)."""


def _attributes(path: Path) -> int:
    """``path``'s attribute bits, or 0 where they cannot be read (no such call on this platform or file system, a
    file that cannot be opened): nothing is refused on a guess."""
    try:
        import fcntl
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except (ImportError, OSError):
        return 0
    try:
        return struct.unpack_from("i", fcntl.ioctl(handle, FS_IOC_GETFLAGS, bytes(8)))[0]
    except OSError:
        return 0
    finally:
        os.close(handle)


def protection(path: Path, replaced: bool = True) -> str | None:
    """What keeps the command from writing the regular file or folder ``path``, in words, or None.

    Parameters
    ----------
    path : Path
        A file the command writes: renames a new one over it or moves it aside (``replaced``), or appends to it; or a
        folder it renames files into or removes them from (``replaced``: an append-only folder takes new names only).
    replaced : bool
        False where the command only appends to it, which an append-only file allows.

    Returns
    -------
    str or None
        ``"immutable (chattr +i)"`` or ``"append-only (chattr +a)"`` where that attribute stops the command's write,
        else None (a link, a missing file or anything but a regular file or folder included: other checks name those).
    """
    path = Path(path)
    if path.is_symlink() or not (path.is_file() or path.is_dir()):
        return None
    flags = _attributes(path)
    if flags & IMMUTABLE:
        return "immutable (chattr +i)"
    if replaced and flags & APPEND_ONLY:
        return "append-only (chattr +a)"
    return None


def refusal(path: Path, attribute: str, remedy: str) -> str:
    """The line that refuses ``path`` for its ``attribute`` (:func:`protection`), with ``remedy``: what else to do."""
    flag = attribute.rpartition("+")[2].rstrip(")")
    return (f"{path} is {attribute}, which stops even root from changing it as this command would: remove the "
            f"attribute (chattr -{flag} {path}), or {remedy}")

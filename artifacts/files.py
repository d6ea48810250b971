"""Writing the bench's outputs safely: atomically (a reader, or a run killed half way or on a full disk, sees the
old file or the new one, never a part of one), with the modes a plain ``open()`` gives, and never over a derived
artifact the run did not write unless told to (the old one is then moved aside, not lost)."""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from runtime import signals
from runtime.bounded_read import METADATA_LIMIT, REPORT_LIMIT, read_bounded, read_text_bounded
from runtime.errors import UsageError


def set_default_mode(path: Path) -> None:
    """Give ``path`` the mode a plain ``open()`` would create it with: ``mkstemp`` and safetensors make files
    private (0600), where everything else the bench writes is readable by the group and others (0644)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


@contextmanager
def atomic_path(path: Path):
    """A temporary path beside ``path`` to write to; it replaces ``path`` (``os.replace``) when the block ends
    without an error, and is removed otherwise."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp" + path.suffix, dir=path.parent)
    os.close(handle)
    set_default_mode(Path(name))
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


def write_result(path: Path, text: str, log: Callable[[str], None] = print) -> Path | None:
    """``path.write_text(text)``, atomically; a file already there (a result :func:`check_replaceable` let this run
    replace) is moved aside to ``<path>.backup-<time>`` first, once the new text is written whole (an empty file,
    which holds nothing, is written over). Returns that backup's path (None where nothing was moved aside): a caller
    that undoes its write puts it back."""
    path, backup = Path(path), None
    with atomic_path(path) as scratch:
        scratch.write_text(text)
        if path.exists() and not _empty_file(path):
            backup = backup_path(path)
            os.replace(path, backup)
            log(f"moved the previous {path.name} to {backup}")
    return backup


def write_rebuilt(path: Path, text: str, log: Callable[[str], None] = print) -> Path:
    """``path.write_text(text)`` for a file a command rebuilds whole on every run (:func:`rebuilt_path`)."""
    with rebuilt_path(path, log) as scratch:
        scratch.write_text(text)
    return Path(path)


@contextmanager
def rebuilt_path(path: Path, log: Callable[[str], None] = print):
    """A temporary path beside ``path`` to write a file a command rebuilds whole on every run (``bench compare``'s
    summary.md and curves.png, ``bench analyze``'s observations): it replaces ``path`` atomically when the block
    ends without an error. The file there is written over when it is what the command wrote last (its SHA-256 is
    kept beside it, in ``.<name>.sha256``); else — edited or replaced by hand, or written before such records — it
    is moved aside to ``<path>.backup-<time>`` first, never lost."""
    path = Path(path)
    record = path.with_name(f".{path.name}.sha256")
    with atomic_path(path) as scratch:
        yield scratch
        if path.exists() and not _empty_file(path):
            remedy = "move it away (the command writes it again)"
            written = read_text_bounded(record, METADATA_LIMIT, remedy).strip() if record.is_file() else None
            if hashlib.sha256(read_bounded(path, REPORT_LIMIT, remedy)).hexdigest() != written:
                backup = backup_path(path)
                os.replace(path, backup)
                log(f"{path.name} was not as the last run wrote it (edited by hand?): moved it to {backup}")
        digest = hashlib.sha256(scratch.read_bytes()).hexdigest()
    write_text(record, digest + "\n")


def backup_path(path: Path) -> Path:
    """Where an artifact a run replaces goes: beside it, named by the time (``<name>.backup-YYYYmmdd-HHMMSS``,
    then ``-2``, ``-3``, … for a second backup within the same second): a name nothing holds, not even a link that
    leads nowhere (which ``exists()`` denies), since the rename into it would replace the user's link."""
    stamp = path.with_name(f"{path.name}.backup-{time.strftime('%Y%m%d-%H%M%S')}")
    backup, copies = stamp, 1
    while os.path.lexists(backup):
        copies += 1
        backup = stamp.with_name(f"{stamp.name}-{copies}")
    return backup


def check_replaceable(target: Path, held: list[Path], what: str, replace: bool) -> None:
    """``ValueError`` before any work if one of ``held`` exists (an empty file holds nothing) and ``replace``
    (``--replace``) was not given: a derived artifact (an estimator, a calibration) that this run did not write is
    never written over unasked.

    Parameters
    ----------
    target : Path
        The directory the run writes the artifact to (:func:`install`).
    held : list[Path]
        The files that hold the artifact there now.
    what : str
        The artifact, as the error names it (``"a GateSight estimator"``).
    replace : bool
        Whether the run was told to replace it (it is then moved aside by :func:`install`).
    """
    present = next((path for path in held if path.exists() and not _empty_file(path)), None)
    if present is not None and not replace:
        raise UsageError(f"{present} holds {what} that this run did not write; pass --replace to write a new one "
                         f"(the old one is first moved aside to {target}.backup-<time>)")


def _empty_file(path: Path) -> bool:
    """An empty file (``touch rows.jsonl`` before the run) holds no result: nothing to keep aside."""
    return path.is_file() and path.stat().st_size == 0


INSTALLED: list[str] = []
"""What :func:`install` (and any other whole result moved into place) has put in place in this process, in words:
a command stopped after it says so, not that nothing was written. The console script clears it per command."""


def install(written: list[Path], target: Path, superseded: list[Path] = (),
            log: Callable[[str], None] = print) -> list[Path]:
    """Move the files of a finished artifact, written in a scratch directory on ``target``'s file system, into
    ``target``, each with its default mode (:func:`set_default_mode`).

    What they replace (a file of the same name in ``target``) and whatever else of ``superseded`` exists is first
    moved into ``<target>.backup-<time>`` beside ``target``: nothing already written is lost or mixed with the new
    files. :func:`check_replaceable` has refused the run before any work unless it was told to replace them.

    Returns
    -------
    list[Path]
        The installed files.
    """
    target.mkdir(parents=True, exist_ok=True)
    old = [path for path in dict.fromkeys([target / f.name for f in written] + list(superseded)) if path.exists()]
    backup = backup_path(target) if old else None
    for path in written:
        set_default_mode(path)
    with signals.held():  # a stop between these renames would leave half an artifact, or none, in target
        if backup is not None:
            _move_aside(old, backup, target)
        for path in written:
            os.replace(path, target / path.name)
        INSTALLED.append(f"{target} holds the new {', '.join(path.name for path in written)}" + (
            f" (the previous files are in {backup})" if backup is not None else ""))
    if backup is not None:
        log(f"moved the previous {', '.join(p.name for p in old)} to {backup}")
    return [target / path.name for path in written]


def _move_aside(old: list[Path], backup: Path, target: Path) -> None:
    """Move ``old`` into the new folder ``backup``; where one cannot be moved (an attribute that even root cannot
    pass, :mod:`artifacts.file_flags`, set after the checks), those moved go back and ``backup`` is removed, and a
    :class:`~runtime.errors.UsageError` names the file: ``target`` holds what it held, and no empty backup is left."""
    backup.mkdir(parents=True)
    moved = []
    try:
        for path in old:
            os.replace(path, backup / path.name)
            moved.append(path)
    except OSError as error:
        for path in reversed(moved):
            os.replace(backup / path.name, path)
        backup.rmdir()
        raise UsageError(f"{old[len(moved)]} cannot be moved aside to {backup} ({error.strerror}): nothing was "
                         f"replaced, {target} holds what it held before; make it movable (lsattr shows an attribute "
                         "such as i or a: chattr -i), then run again") from None

"""One writer at a time: a store's ``.lock`` file, locked by its writer for its whole run and naming its pid.

A reader asks whether a store is being written (:func:`lock_holder`) without waiting; a writer waits a moment for the
lock (:data:`LOCK_WAIT_SECONDS`) and then refuses, naming the process that holds it.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import IO

from artifacts.file_flags import protection, refusal
from runtime.bounded_read import METADATA_LIMIT, read_bounded
from runtime.errors import UsageError, check_regular_file

LOCK_WAIT_SECONDS = 1.0
"""How long a writer waits for a store's lock before it refuses: :func:`lock_holder` (verify asking whether a store
is being written) holds it for microseconds, a writer for its whole run."""
LOCK_REMEDY = "move it away (bench makes its lock file itself)"
"""What a user does about a thing where a store's lock belongs: the lock is the bench's own file, made as a writer
starts (probe 8: the general "put the file there" asked them to make one)."""


def _lock_within(handle, seconds: float) -> None:
    """An exclusive lock on ``handle`` within ``seconds``; ``BlockingIOError`` if another holds it that long."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def _owner(path: Path) -> str:
    """The pid a store's lock file ``path`` holds (``unknown`` if none, or if its writer just removed it), read within
    :data:`~runtime.bounded_read.METADATA_LIMIT`: a 20 GB lock read whole ended verify in ``MemoryError`` (probe 11)."""
    try:
        return read_bounded(path, METADATA_LIMIT, LOCK_REMEDY).decode(errors="replace").strip() or "unknown"
    except FileNotFoundError:
        return "unknown"


def take_lock(directory: Path) -> IO:
    """The writer's lock on the store in ``directory`` (its ``.lock`` file, open and locked, holding this pid);
    ``UsageError`` naming the holder's pid when another process holds it past :data:`LOCK_WAIT_SECONDS`."""
    path = directory / ".lock"
    check_regular_file(path, "a store's lock", LOCK_REMEDY)
    attribute = protection(path)  # a lock is cut and removed, not only appended to (probe 12: a traceback on +a)
    if attribute is not None:
        raise UsageError(refusal(path, attribute, "write to another store"))
    while True:
        handle = path.open("a+")
        try:
            _lock_within(handle, LOCK_WAIT_SECONDS)
        except BlockingIOError:
            handle.close()
            owner = _owner(path)
            raise UsageError(f"{directory} is being written by another process (pid {owner}); wait for it "
                             "to finish or write to another --out") from None
        try:  # the holder before us removes the file before it unlocks: a lock on a removed file is no lock
            if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        handle.close()
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def release_lock(directory: Path, handle: IO) -> None:
    """Release the lock :func:`take_lock` returned and remove its file (while still held: see :func:`take_lock`)."""
    (directory / ".lock").unlink(missing_ok=True)
    fcntl.flock(handle, fcntl.LOCK_UN)
    handle.close()


def lock_holder(directory: Path) -> str | None:
    """The pid (as its lock file holds it, ``unknown`` if none) of the process writing the store in ``directory``,
    or None when none holds its lock (a lock file a killed writer left is no lock)."""
    check_regular_file(Path(directory) / ".lock", "a store's lock", LOCK_REMEDY)
    try:
        handle = (Path(directory) / ".lock").open("r")
    except FileNotFoundError:
        return None
    with handle:
        try:  # a shared lock is refused while a writer holds its exclusive one; released at once
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _owner(Path(directory) / ".lock")
        fcntl.flock(handle, fcntl.LOCK_UN)
        return None

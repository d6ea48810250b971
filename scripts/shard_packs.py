"""Shards of a long sweep carried between sessions: ``pack`` commits each store's rows as ``results.jsonl.gz``,
``unpack`` puts the committed rows back where the sweep resumes them (``bench compare`` resumes a committed ``.gz``).

Usage: ``python scripts/shard_packs.py pack|unpack OUT KEPT`` — the stores are ``OUT/<sweep>/shard<K>``, their packs
``KEPT/<sweep>/shard<K>/results.jsonl.gz``. Rows are only ever added: a pack is replaced only by rows that start with
every byte of it, a store only by a pack that starts with every byte of its rows; where the two went apart nothing is
written and the store is named (exit 2). Packs are gzip with mtime 0 (the same rows, the same bytes), written
atomically. A pack may be taken while the sweep runs (whole lines only); an unpack waits until the store's writer
stops (it would replace the file the writer appends to), and a damaged pack or a directory without stores is named.
"""

from __future__ import annotations

import gzip
import os
import sys
from pathlib import Path

from bench.store.result_store import whole_rows
from bench.store.store_lock import lock_holder

PACK = "results.jsonl.gz"
LIVE = "results.jsonl"


def stored_bytes(store: Path) -> bytes | None:
    """The rows of a result store as bytes: its ``results.jsonl`` (which continues any ``.gz`` beside it), else its
    committed ``.gz``; None where it holds neither. A last line cut short (a row being written, or cut by a kill) is
    left out, as a resume drops it (:func:`bench.store.result_store.whole_rows`): a pack that held it would no longer be
    continued; a whole last row without its newline is a row, as every reader reads it."""
    committed = whole_rows(unzipped(store / PACK)) if (store / PACK).is_file() else None
    if not (store / LIVE).is_file():
        return committed
    rows = whole_rows((store / LIVE).read_bytes())
    if committed is not None and not rows.startswith(committed):
        raise Diverged(f"{store / LIVE} does not continue {store / PACK} beside it (every reader refuses the store): "
                       "nothing was written; keep the one you want and move the other aside")
    return rows


def unzipped(pack: Path) -> bytes:
    """A pack's rows; :class:`Refused` naming it if it is no whole gzip file."""
    try:
        return gzip.decompress(pack.read_bytes())
    except (OSError, EOFError) as error:  # not gzip, or cut short
        raise Refused(f"{pack}: not a complete gzip file ({error}): nothing was written; restore it from version "
                      "control") from None


class Refused(Exception):
    """Nothing was written: the stores or packs are not what the step can carry (named in the message)."""


class Diverged(Refused):
    """A store and its pack went apart: nothing was written."""


def _count(rows: bytes) -> int:
    return rows.count(b"\n") + (not rows.endswith(b"\n") and bool(rows))


def _stores(root: Path) -> list[Path]:
    return sorted(path for path in root.glob("sweep*/shard*") if path.is_dir())


def _check_places(step: str, root: Path, directory: Path, files: tuple[str, ...]) -> None:
    """:class:`Refused` where ``directory`` (under ``root``) or one of its ``files`` cannot be written as such: a
    file where a folder belongs or the reverse, checked before anything is written."""
    for path in [*reversed(directory.relative_to(root).parents), directory.relative_to(root)]:
        place = root / path
        if place.exists() and not place.is_dir():
            raise Refused(f"{step}: {place} is a file where a folder belongs: nothing was {step}ed; move it aside")
    for name in files:
        if (directory / name).exists() and not (directory / name).is_file():
            raise Refused(f"{step}: {directory / name} is not a file: nothing was {step}ed; move it aside")


def _check_apart(step: str, out: Path, kept: Path) -> None:
    if out.exists() and kept.exists() and out.resolve() == kept.resolve():
        raise Refused(f"{step}: OUT and KEPT are one directory ({out}): the stores would be their own packs; "
                      f"nothing was {step}ed")


def _check_distinct(step: str, places: list[Path]) -> None:
    """:class:`Refused` where two of the stores and packs' folders are (or would be, once made) one directory
    through a link: one would take the other's rows."""
    seen: dict[Path, Path] = {}
    for place in places:
        real = place.resolve()
        if real in seen:
            raise Refused(f"{step}: {place} and {seen[real]} are one directory (a link): one shard would take the "
                          f"other's rows; nothing was {step}ed")
        seen[real] = place


def _write(step: str, done: list[str], scratch: Path, target: Path, write) -> None:
    """``write(file)`` into ``scratch``, synced, then moved onto ``target`` at once; a failure (a full disk, a
    read-only folder) is :class:`Refused` naming the path and what was done before it, the scratch removed."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with scratch.open("wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(scratch, target)
    except OSError as error:
        scratch.unlink(missing_ok=True)
        before = f"; done before it: {'; '.join(done)}" if done else "; nothing was written"
        raise Refused(f"{step}: cannot write {error.filename or target} ({error.strerror or error}){before}") \
            from None


def pack(out: Path, kept: Path) -> list[str]:
    """Each store of ``out`` packed into ``kept``; returns what was done, one line a store. :class:`Refused`,
    before anything is written, where a store's rows do not continue its pack (:class:`Diverged`) or a pack cannot
    be written where it belongs."""
    _check_apart("pack", out, kept)
    _check_distinct("pack", [*_stores(out), *(kept / store.relative_to(out) for store in _stores(out))])
    plans = []
    for store in _stores(out):
        _check_places("pack", out, store, (LIVE, PACK))  # a folder or pipe in a store file's place is no store
        rows = stored_bytes(store)
        if rows is None:
            continue
        target = kept / store.relative_to(out) / PACK
        _check_places("pack", kept, target.parent, (PACK, PACK + ".partial"))
        if target.parent.resolve() == store.resolve():
            raise Refused(f"pack: {target} is {store}'s own file (a link between OUT and KEPT): nothing was packed")
        committed = whole_rows(unzipped(target)) if target.is_file() else b""
        if not rows.startswith(committed):
            raise Diverged(f"pack: {store}'s rows do not continue {target} (they are not its rows plus new ones): "
                           f"nothing was packed. Run `unpack` first where {store} is an older copy; otherwise keep "
                           "the one you want and move the other aside")
        plans.append((store, target, rows, committed))
    if not plans:
        raise Refused(f"pack: no store under {out} (expected {out}/sweep*/shard*/{LIVE} or {PACK}): nothing was "
                      "packed")
    done = []
    for store, target, rows, committed in plans:
        if rows == committed:
            done.append(f"{store}: unchanged ({_count(rows)} rows)")
            continue
        def packed(file, rows=rows, scratch=target.with_name(PACK + ".partial")):
            with gzip.GzipFile(str(scratch), "wb", fileobj=file, mtime=0) as stream:
                stream.write(rows)

        _write("pack", done, target.with_name(PACK + ".partial"), target, packed)
        done.append(f"{store}: {_count(rows)} rows packed into {target} ({_count(rows) - _count(committed)} new)")
    return done


def unpack(out: Path, kept: Path) -> list[str]:
    """Each pack of ``kept`` put back into ``out`` where the store there is missing or an older copy of it; returns
    what was done, one line a pack. :class:`Refused`, before anything is written, where a store and its pack went
    apart (:class:`Diverged`), a store's writer runs, or a store cannot be written where it belongs."""
    _check_apart("unpack", out, kept)
    _check_distinct("unpack", [*_stores(kept), *(out / packed.relative_to(kept) for packed in _stores(kept))])
    plans = []
    for packed_store in _stores(kept):
        if not (packed_store / PACK).is_file():
            continue
        store = out / packed_store.relative_to(kept)
        _check_places("unpack", out, store, (LIVE, PACK, PACK + ".partial"))
        if store.exists() and store.resolve() == packed_store.resolve():
            raise Refused(f"unpack: {store} is {packed_store} (a link between OUT and KEPT): it is its own pack; "
                          "nothing was unpacked")
        committed, rows = whole_rows(unzipped(packed_store / PACK)), stored_bytes(store)
        if rows is not None and not (rows.startswith(committed) or committed.startswith(rows)):
            raise Diverged(f"unpack: {store} and {packed_store / PACK} went apart (neither starts with the other's "
                           "rows): nothing was unpacked; keep the one you want and move the other aside")
        writer = lock_holder(store) if store.is_dir() else None
        if writer is not None and not (rows is not None and rows.startswith(committed)):
            raise Refused(f"unpack: {store} is being written by another process (pid {writer}), and unpacking "
                          f"would replace the file it appends to: nothing was unpacked; stop it first (SIGTERM "
                          "keeps what it finished)")
        plans.append((packed_store, store, rows, committed))
    if not plans:
        raise Refused(f"unpack: no pack under {kept} (expected {kept}/sweep*/shard*/{PACK}): nothing was unpacked")
    done = []
    for packed_store, store, rows, committed in plans:
        if rows is not None and rows.startswith(committed):
            done.append(f"{store}: kept ({_count(rows)} rows, the pack's {_count(committed)} and more)")
            continue
        # the pack beside the store before its older copy goes
        _write("unpack", done, store / (PACK + ".partial"), store / PACK,
               lambda file, pack=packed_store / PACK: file.write(pack.read_bytes()))
        (store / LIVE).unlink(missing_ok=True)
        done.append(f"{store}: {_count(committed)} rows unpacked"
                    + (f" over an older copy of {_count(rows)}" if rows is not None else ""))
    return done


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("pack", "unpack"):
        sys.exit("usage: python scripts/shard_packs.py pack|unpack OUT KEPT")
    step, out, kept = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    try:
        for line in (pack if step == "pack" else unpack)(out, kept):
            print(line)
    except Refused as error:
        print(error, file=sys.stderr)
        sys.exit(2)

"""Append-only JSONL result store: one row per answered question, keyed by every setting that produced it.

A killed run resumes where it stopped: finished keys are skipped, a half-written last line is ignored, and
nothing already written is ever rewritten. One writer at a time holds the store's lock; a line that is not a row (but
a last line cut short) is named by file and line and refused by every check (:meth:`ResultStore.problems`). A
committed store (``results.jsonl.gz`` alone) is resumed too: its rows are copied to ``results.jsonl`` before the
first new one is appended there, and the ``.gz`` is kept.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from artifacts.files import atomic_path
from artifacts.output_kinds import GROUP_FOLDER
from artifacts.outputs import Output, check_place
from runtime.bounded_read import read_bounded
from runtime.errors import UsageError, check_regular_file
from runtime.gunzip import GunzipLimitError, gunzip
from runtime.json_text import parse_json

from .carried_codes import read_under
from .legacy_rows import not_a_row, read_row
from .row_checks import key_problem
from .row_fields import FIDELITY_FIELDS, SCHEMA, row_key
from .row_set_checks import verify_rows
from .store_lock import lock_holder, release_lock, take_lock

STORE_LIMIT = 2 << 30
"""The most a store's rows may hold, plain or unpacked from gzip (the largest published group unpacks to tens of MB):
past it, no store the bench wrote, refused before memory runs out (:mod:`runtime.gunzip`,
:mod:`runtime.bounded_read`)."""

ZEROS = ("holds NUL bytes, which no run writes (a crash or a failing disk leaves zeros where a file's blocks were "
         "never written): the file is damaged; restore it from a backup or version control, or cut it after its "
         "last whole row")
"""Why a line holding NUL bytes is no row, nor a last line cut short by a stopped run (probe 11)."""
TAIL_BYTES = 256
"""How much of a file's end :func:`_snapshot` keeps: enough to hold the end of the last row written."""


def _snapshot(path: Path) -> tuple | None:
    """The file at ``path`` as it is now, None where there is none: its device, inode (a new file may reuse a
    removed one's), size and last :data:`TAIL_BYTES` bytes. Not its times: a ``touch``, a ``chmod`` or a backup's
    hard link changes no row."""
    try:
        with path.open("rb") as f:
            stat = os.fstat(f.fileno())
            f.seek(max(0, stat.st_size - TAIL_BYTES))
            return stat.st_dev, stat.st_ino, stat.st_size, f.read(TAIL_BYTES)
    except FileNotFoundError:
        return None
    except OSError as error:  # a directory in its place, no permission: reading it names the problem
        return (error.errno,)


def whole_rows(data: bytes) -> bytes:
    """A store's bytes less a last line cut short (no newline, not JSON): what a resume keeps of them
    (:meth:`ResultStore._drop_cut_line`), and so what a resumed ``results.jsonl`` starts with."""
    end = data.rfind(b"\n") + 1
    try:
        parse_json(data[end:] or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return data[:end]
    return data


class ResultStore:
    """``results.jsonl`` under ``directory``, or a committed ``results.jsonl.gz`` there alone.

    A writer resumes a committed store: before its first row it copies the ``.gz``'s rows to ``results.jsonl``
    (atomically), where it appends; the ``.gz`` is kept. From then on ``results.jsonl`` continues the ``.gz`` (starts
    with its every byte) and is what readers read; a ``results.jsonl`` beside a ``.gz`` that it does not continue (a
    store written beside a committed one) is refused, since reading either would leave out the other's rows.

    Parameters
    ----------
    directory : path
    readonly : bool
        Readers (reports) take no lock; a writer takes an exclusive lock at once and keeps it while it lives,
        so that a second writer on the same directory is refused instead of duplicating rows.
    named : str
        How a refused directory is named: the CLI's flag, or a library function's argument.
    """

    def __init__(self, directory, readonly: bool = False, named: str = "--out"):
        self.directory = Path(directory)
        self.named = named
        self.live = self.directory / "results.jsonl"
        """Where rows are appended."""
        self.path = self.live
        """The file the rows were read from: ``live``, or the committed ``.gz`` until a first row is appended."""
        self.rows: list[dict] = []
        self.line_numbers: list[int] = []
        """The file's line of each row."""
        self.skipped: list[tuple[int, str]] = []
        """The lines that are no row (not JSON, or lacking a row's fields), with what they are: every check refuses
        them (:meth:`problems`), a row lacking ``task`` as one lacking ``kl``."""
        self.cut_line: int | None = None
        """The last line, if it is cut short (a run killed while writing it: a rerun resumes past it)."""
        self._lock = None
        self._created = False
        if not readonly:
            self._acquire()
        packed = self.directory / "results.jsonl.gz"
        for path in (self.live, packed):  # a folder or a pipe there is no store (a pipe would be read forever)
            check_regular_file(path, "a result store's file")
        if packed.exists() and not self.live.exists():  # a committed, compressed store
            self.path = packed
        self._files = {path: _snapshot(path) for path in (self.live, packed)}
        """The store's files as this store read or last wrote them (None where there was none): another process
        that removes, replaces or writes one under a writer (an unpack, a checkout) is seen before the next row,
        whose rows would otherwise land in a new file, or beside rows read from another."""
        data = self._read(self.path) if self.path.exists() else b""
        if self.path == self.live and packed.exists() and not data.startswith(whole_rows(self._read(packed))):
            raise UsageError(f"{self.live} does not continue {packed} (it was not resumed from it): the committed "
                             "rows are in the .gz alone, and reports would read results.jsonl alone. Move "
                             "results.jsonl to a directory of its own, or join the two into one results.jsonl (the "
                             ".gz's lines first)")
        lines = data.split(b"\n")
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            try:
                value = parse_json(raw.decode("utf-8-sig" if number == 1 else "utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                value = None
            row = read_row(value)
            if row is not None:
                self.rows.append(row)
                self.line_numbers.append(number)
            elif b"\0" in raw:  # not what a stopped run leaves: a rerun would resume over a damaged file
                self.skipped.append((number, ZEROS))
            elif number == len(lines) and value is None:  # a last line cut by a kill is normal (not JSON)
                self.cut_line = number
            else:
                self.skipped.append((number, not_a_row(value)))
        self.file_rows = list(self.rows)
        """The rows as its file holds them, before its group's carries (what ``bench publish`` writes back)."""
        self.carried = read_under(self.rows, self.directory)  # a collection's carried groups, read under its records
        """What each record of the group folder's carries that names this store carried of its rows: ``{index in the
        file: rows of each context}`` (:func:`~bench.store.carried_codes.read_under`)."""
        # an append ends a last line without its newline first
        self._next_line = data.count(b"\n") + (2 if data and not data.endswith(b"\n") else 1)
        self.done = {row_key(r) for r in self.rows if key_problem(r) is None}  # a bad key is check_rows' to name

    @staticmethod
    def _read(path: Path) -> bytes:
        """A store file's bytes, uncompressed; ``ValueError`` naming the file if it is not a readable store."""
        # the plain rows are bounded as the unpacked ones are; packed, they are smaller than unpacked
        raw = read_bounded(path, STORE_LIMIT, "no store the bench wrote holds that much: move it away, or split "
                           "its rows into shards")
        if path.suffix != ".gz":
            return raw
        try:
            return gunzip(raw, STORE_LIMIT)
        except GunzipLimitError as error:
            raise UsageError(f"{path}: {error}, past what a store holds: no store the bench wrote (move it away, or "
                             "restore it from version control)") from None
        except (OSError, EOFError) as error:  # not gzip, or cut short
            if path.is_symlink():  # a user's file linked in, never a version of the store (probe 8): name the link
                raise UsageError(f"{path}: a link to {os.readlink(path)}, which is not a complete gzip file "
                                 f"({error}); a store keeps its own files: move the link away") from None
            raise UsageError(f"{path}: not a complete gzip file ({error}); restore it from version control") \
                from None

    def _unpack(self) -> None:
        """Resume the committed store: its rows copied to ``live`` (whole or not at all), the ``.gz`` kept."""
        with atomic_path(self.live) as scratch:
            with scratch.open("wb") as f:
                f.write(self._read(self.path))
                f.flush()
                os.fsync(f.fileno())
        print(f"note: {self.path} is resumed: its rows are copied to {self.live}, where new rows are appended (the "
              ".gz is left as it is)", file=sys.stderr)
        self.path = self.live
        self._files[self.live] = _snapshot(self.live)

    def problems(self) -> list[str]:
        """What is wrong with this store's lines, as ``file:line: problem``: a line that is no row (but a last line
        cut short, :attr:`cut_line`), and each row's problems (:func:`row_problem`)."""
        unread = [f"{self.path}:{number}: {problem}" for number, problem in self.skipped]
        return unread + verify_rows(self.rows, lambda index: f"{self.path}:{self.line_numbers[index]}")

    def check_rows(self) -> None:
        """``ValueError`` listing the first bad rows by file and line, so that no report shows them."""
        problems = self.problems()
        if problems:
            shown = "; ".join(problems[:5]) + (f"; … ({len(problems) - 5} more)" if len(problems) > 5 else "")
            raise UsageError(f"{len(problems)} row(s) are not valid results: {shown}")

    def _acquire(self) -> None:
        check_place(Output(self.directory, self.named))  # the one output policy, for a library caller too
        self._created = not self.directory.exists()
        self.directory.mkdir(parents=True, exist_ok=True)
        packed = self.directory / "results.jsonl.gz"
        for own in (self.directory / ".lock", self.directory / "results.jsonl", packed):
            if own.is_symlink():  # written through, rows would land in the link's target (a model's config.json)
                raise UsageError(f"{own}: a link to {os.readlink(own)}; a store writes its own files: move the link "
                                 f"away or use another {self.named}")
            # a hard link is the same file under another name, written too (the .gz is only read)
            if own != packed and own.is_file() and own.stat().st_nlink > 1:  # a folder has 2 or more
                raise UsageError(f"{own}: one file with {own.stat().st_nlink} names (a hard link: `cp -al`, a "
                                 "snapshot, or a file of elsewhere); a store writes its own files: copy it with "
                                 f"`cp -r`, or use another {self.named}")
        self._lock = take_lock(self.directory)

    def close(self) -> None:
        """Release the writer's lock (also released when the process ends) and remove its file; a directory this
        writer created and left empty (a run refused before its first row) is removed too."""
        if self._lock is not None:
            release_lock(self.directory, self._lock)
            self._lock = None
            if self._created and not any(self.directory.iterdir()):
                self.directory.rmdir()

    def check_model(self, model: str, identity: dict) -> None:
        """Refuse to add results of ``model`` to a store that holds results of another version of it (other
        weights, config or tokenizer: ``identity`` is :meth:`pretrained.loading.ModelIdentity.row_fields`), naming
        what differs. Other derived artifacts are no refusal: rows key and group by them, so they never mix.
        Rows written before the model's parts were recorded fingerprinted it another way and are not compared."""
        same_name = [r for r in self.rows if r["model"] == model and isinstance(r.get("model_parts"), dict)]
        other = next((r for r in same_name if r["weights"] != identity["weights"]), None)
        if other is not None:
            differ = [part for part, value in identity["model_parts"].items()
                      if other["model_parts"].get(part) != value]
            raise UsageError(f"{self.path} holds results of model {model!r} with other {' and '.join(differ)} "
                             f"(fingerprint {other['weights']}, this one is {identity['weights']}); "
                             "write to a new --out directory")
        artifacts = sorted({str(r.get("artifacts")) for r in same_name} - {identity["artifacts"]})
        if artifacts:
            print(f"note: {self.path} holds results of model {model!r} with other artifacts (gatesight/, "
                  f"calibration/: {', '.join(artifacts)}; this one's are {identity['artifacts']}); rows record "
                  "their artifacts, so the two are never mixed", file=sys.stderr)

    def check_schema(self) -> None:
        """Refuse a store with rows written before the fidelity metrics (schema < 2): never mix the two."""
        old = sum(1 for r in self.rows if r.get("schema", 1) < SCHEMA)
        if old:
            raise UsageError(f"{self.path} holds {old} row(s) written before the fidelity metrics "
                             f"({', '.join(FIDELITY_FIELDS)}) existed; they cannot be compared with new rows. "
                             "Write to a new --out directory (and rerun the old settings there)")

    def _drop_cut_line(self) -> None:
        """Before the first new row: the last line a stopped run cut short (no whole row: not JSON) is removed, so
        that the resumed store holds rows only, and no reader warns of that line ever after."""
        with self.path.open("r+b") as f:
            data = f.read()
            f.truncate(data.rfind(b"\n") + 1)
        self._files[self.path] = _snapshot(self.path)
        print(f"note: {self.path}: line {self.cut_line}, cut short by the run that stopped, removed before the "
              "first new row (it held no whole row)", file=sys.stderr)
        self._next_line, self.cut_line = self.cut_line, None

    def has(self, key: tuple) -> bool:
        return key in self.done

    def append(self, row: dict) -> None:
        if self._lock is None:
            raise RuntimeError("this store was opened read-only")
        key = row_key(row)
        if key in self.done:
            return
        for path, known in self._files.items():
            if _snapshot(path) != known:
                done = "created" if known is None else "changed" if path.exists() else "removed"
                raise UsageError(f"{path} was {done} by another process while this run (pid {os.getpid()}) held the "
                                 "store's lock: the rows it read or wrote are no longer what the store holds, and "
                                 "nothing more is written. A step that moves stores (an unpack, a checkout) waits "
                                 "until the run stops; then rerun the same command to resume from what the "
                                 "directory holds")
        if self.path != self.live:
            self._unpack()
        if self.cut_line is not None:
            self._drop_cut_line()
        with self.path.open("ab") as f:
            if f.tell() > 0:
                # make sure a previous partial line cannot swallow this row
                with self.path.open("rb") as check:
                    check.seek(-1, os.SEEK_END)
                    if check.read(1) != b"\n":
                        f.write(b"\n")
            f.write((json.dumps(row) + "\n").encode())
            f.flush()
            os.fsync(f.fileno())
        self._files[self.path] = _snapshot(self.path)
        self.rows.append(row)
        self.line_numbers.append(self._next_line)
        self._next_line += 1
        self.done.add(key)


def open_stores(directories: list[Path]) -> list[ResultStore]:
    """The stores a command reads (``bench verify``, ``leaderboard`` and ``merge``), read-only, each checked first:
    an existing directory (not the ``results.jsonl`` in it) that holds ``results.jsonl`` or ``results.jsonl.gz``
    and that no writer holds (its rows would be read half written); a collection of stores
    (:mod:`bench.store.collection`) is read as its stores.

    Raises
    ------
    UsageError
        Naming the first store that is not one: no such directory, a file, a directory without rows, or one being
        written by another process (the pid in its lock file).
    """
    from .collection import expand, first_store_below, found  # a collection (docs/results) is read as its stores

    directories = expand(directories)
    for directory in map(Path, directories):
        if directory.is_file():
            raise UsageError(f"{directory} is a file: give the store's directory, here {directory.parent}")
        # the --out of an empty shard (more shards than the run has contexts) is neither: it wrote no rows
        empty_shard = "an empty shard of compare --shard K/N writes none: leave it out"
        if not directory.is_dir():
            raise UsageError(f"{directory}: no such directory (a store is the --out of bench compare or merge; "
                             f"{empty_shard})")
        if not any((directory / name).exists() for name in ("results.jsonl", "results.jsonl.gz")):
            if GROUP_FOLDER.fullmatch(directory.name) and found(directory, "*/results.jsonl*"):
                # a collection's <group>/ holds its stores one level down
                raise UsageError(f"{directory} is a setting group's folder of the collection {directory.parent} "
                                 f"(its stores are {directory}/<method>/): give the collection {directory.parent}, "
                                 "or one store of it")
            below = first_store_below(directory)
            hint = f"({empty_shard})" if below is None else (
                f"(a store lies below it, {below}: give that store, or the collection it is in, "
                f"{below.parent.parent}, as a collection holds its stores at <group>/<method>/)"
                if GROUP_FOLDER.fullmatch(below.parent.name) else f"(a store lies below it, {below}: give the "
                "stores themselves)")
            raise UsageError(f"{directory} holds no results.jsonl (nor results.jsonl.gz): it is not a result store "
                             + hint)
        writer = lock_holder(directory)
        if writer is not None:
            raise UsageError(f"{directory} is being written by another process (pid {writer}); wait for it to "
                             "finish, then read it")
    return [ResultStore(directory, readonly=True) for directory in directories]

"""``bench publish``: the rows of finished stores added to a collection (:mod:`bench.store.collection`), writing only
the files of the methods whose rows it adds: a new method is a new file, the others keep their bytes, so a commit of it
adds only the new rows' bytes to the repository's history.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from artifacts.file_flags import protection, refusal
from artifacts.files import atomic_path
from artifacts.output_kinds import COLLECTION, mix_problem
from runtime.errors import UsageError

from .carried_codes import CARRIED, carried_from, carried_records, read_records, under_records
from .code_version import code_version
from .collection import PACK, case_twins, group_folder, laid_out, method_folder
from .copies import batch_difference, row_values
from .result_store import open_stores
from .row_fields import CONTEXT_SHA, describe_row, row_key
from .store_checks import check_stores


def _pack(rows: list[dict]) -> bytes:
    """A store file of ``rows``: the same rows give the same bytes (no time in the gzip header)."""
    return gzip.compress("".join(json.dumps(row) + "\n" for row in rows).encode(), mtime=0)


def _check_place(into: Path, path: Path) -> None:
    """``UsageError`` if the collection's file ``path`` (``<group>/<method>/results.jsonl.gz`` of ``into``), or a
    folder of it, is a link or no folder: a file is written whole beside its place and renamed there, which would
    replace the user's link (:mod:`artifacts.outputs`' rule: a link the user made is never renamed, moved nor
    replaced, nor written through)."""
    for place in (path.parent.parent, path.parent, path):
        if place.is_symlink():
            target = os.readlink(place)
            gone = "" if place.exists() else ", which does not exist"
            raise UsageError(f"--into {into}: {place} is a link (to {target}{gone}); publish writes the collection's "
                             "own folders and files and never writes through nor replaces a link: put what it names "
                             "there in its place (or remove the link), then publish again")
        if place != path and place.exists() and not place.is_dir():
            raise UsageError(f"--into {into}: {place} is not a folder, where the collection keeps a setting group's "
                             "or a method's store; move it away, then publish again")


def _check_attributes(into: Path, paths: list[Path]) -> None:
    """``UsageError`` if an attribute keeps even root from writing one of the collection's files ``paths`` as publish
    does (:func:`artifacts.file_flags.protection`): the file renamed over, its method folder renamed into (an
    append-only one takes the part file but neither the rename nor its removal), or the nearest folder it makes its
    folders in (an immutable one). Checked for every file before any is written: probe 12 found an immutable file
    after the files before it were rewritten, in a bare errno, the collection failing verify and a part file left."""
    for path in paths:
        folder = next(place for place in (path.parent, path.parent.parent, into) if place.is_dir() or place == into)
        for place, replaced in ((path, True), (folder, folder == path.parent)):
            attribute = protection(place, replaced=replaced)
            if attribute is not None:
                raise UsageError(refusal(place, attribute, "publish into a copy of the collection"))


def _as_read(row: dict, into: Path, source: Path, carries: dict[Path, tuple[list, list]]) -> dict:
    """``row`` of the store ``source`` as the collection ``into`` will read it in its method's folder there: under
    the carries its group folder's record (:data:`~bench.store.carried_codes.CARRIED`) names for that folder, as
    every reader of the collection reads its rows (probe 16: a store of a group's code before its carry was compared
    by its raw code, and its no-prune rows were written beside the carried ones, which verify then refused).
    ``UsageError`` for a row of a code a carry of its group carried away from that the carry did not cover (a method
    not in the group then): the group's rows are read under the other code. ``carries`` caches, by method folder, the
    records that name it and every record of its group."""
    store = into / group_folder(row) / method_folder(row)
    if store not in carries:
        carries[store] = (carried_records(store), read_records(store.parent / CARRIED))
    covering, every = carries[store]
    if every and row.get("code") == every[-1]["to"]:  # the group's code now, whatever codes its chain revisits
        return row
    [read] = under_records([row], covering)
    if every and read.get("code") == every[-1]["to"]:  # read at the group's code now: no record after carries it away
        return read
    record = carried_from(read, every)
    if record is not None:
        now, here = every[-1]["to"], code_version(row.get("engine", "hf"))
        # a carry takes a store to the code of the checkout it runs in (probe 24, U1: advised where it did nothing)
        advice = (f"carry the store to this checkout's code (bench carry {source}), or rerun it here, then publish it"
                  if here == now else
                  f"the group is of code {now} now, this checkout of code {here}: carry the store to code {now} with "
                  f"a checkout of that code (bench carry {source}) and publish it from there, or carry the group to "
                  f"this checkout's code first (bench carry {store.parent})")
        raise UsageError(f"{source}: the row of {describe_row(row)} is of code {row.get('code')}, from which "
                         f"{store.parent} was carried to code {record['to']}"
                         f"{'' if record['to'] == now else f' and on to code {now}'} ({store.parent / CARRIED}), and "
                         f"the carry did not cover it (its method was not in the group then): {advice}")
    return read


def publish(sources: list[Path], into: Path, say: Callable[[str], None] = lambda line: None) -> list[Path]:
    """Add every row of the stores ``sources`` (each whole, as ``bench verify`` checks it) that the collection
    ``into`` lacks, each read as the collection will read it (:func:`_as_read`: under its group's carries); returns
    the files written. A row it holds with the same values is left (a no-prune row every run
    answers alike); one it holds with other values is refused, naming it. The collection with the new rows is checked
    whole (every context of every group with every method) before a file of it is written, and no file of it is
    written through a link (:func:`_check_place`). ``say`` receives a line as each step starts (a large collection
    takes a minute to check)."""
    problem = mix_problem(into, COLLECTION)  # a library caller too: a store, a group's folder, one inside
    if problem is not None:
        raise UsageError(f"--into {into}: {problem}")
    opened = open_stores(list(sources))  # a path that is no store is refused before a line is said
    say(f"checking {', '.join(map(str, sources))}")
    check_stores(opened)
    below = laid_out(into) if into.is_dir() else []
    say(f"reading the {len(below)} store(s) of {into}")
    held = open_stores(below)
    # each file's rows as it holds them (its group's records read them again); as read, to meet the new rows
    files: dict[Path, list[dict]] = {store.path: store.file_rows for store in held}
    known = {row_key(row): row for store in held for row in store.rows}
    added: dict[Path, list[dict]] = {}
    carries: dict[Path, tuple[list, list]] = {}
    for source, raw in ((store, raw) for store in opened for raw in store.rows):
        row = _as_read(raw, into, source.directory, carries)
        old = known.get(row_key(row))
        if old is None and row.get("code") != raw.get("code"):  # probe 19: a record forged to name it carried it
            raise UsageError(f"{source.directory}: the row of {describe_row(raw)} is of code {raw.get('code')}, which "
                             f"{into / group_folder(row)} was carried away from to code {row.get('code')}, but the "
                             "group does not hold it, so no carry reran it: carry the store to this checkout's code "
                             f"(bench carry {source.directory}), then publish it")
        if old is not None:  # the first copy is kept; another padded batch changes the last digits alone
            if old.get(CONTEXT_SHA) != row.get(CONTEXT_SHA):
                raise UsageError(f"task {row['task']}, item {row['item']} ({row.get('haystack')} haystack) of "
                                 f"{describe_row(row)} is another text (digest {row.get(CONTEXT_SHA)}) than the one "
                                 f"{into} holds (digest {old.get(CONTEXT_SHA)}): a haystack of real text reads the "
                                 "machine's files, so a method joins a group only where they are the same")
            if row_values(old) != row_values(row) and batch_difference(old, row) is None:
                raise UsageError(f"{into} holds the row of {describe_row(row)} with other values: one key, one value "
                                 "(rerun it under the code the collection's group names, or publish it apart)")
            continue
        path = into / group_folder(row) / method_folder(row) / PACK
        if path not in added:
            _check_place(into, path)
            # before the folder is looked for: where case is ignored, its twin would be found in its place
            twins = case_twins([*below, *(new.parent for new in added), path.parent])
            if twins is not None:
                raise UsageError(twins)
        if path.exists() and path not in files:
            raise UsageError(f"{path} is not a store of this collection's (unreadable): restore it from version "
                             "control")
        added.setdefault(path, []).append(row)
        known[row_key(row)] = row
    if not added:
        return []
    _check_attributes(into, list(added))
    rows_then = sum(map(len, files.values())) + sum(map(len, added.values()))
    say(f"checking {into} with the {sum(map(len, added.values()))} new row(s): {rows_then} rows in all")
    with tempfile.TemporaryDirectory(prefix="publish-") as scratch:  # the collection as it will be, checked first
        for path, rows in {**files, **{p: files.get(p, []) + rows for p, rows in added.items()}}.items():
            target = Path(scratch) / path.relative_to(into).parent / PACK
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(_pack(rows))
        # with each group's record of its carries, the scratch copy is read as verify will read the collection
        for group in {path.parent.parent for path in [*files, *added]}:
            records = read_records(group / CARRIED)
            if records:
                (Path(scratch) / group.relative_to(into) / CARRIED).write_text(json.dumps(records))
        try:
            check_stores(open_stores(laid_out(Path(scratch))))
        except UsageError as error:  # named by the collection's files, not the scratch copy that is gone by then
            raise UsageError(f"{into} with the rows of {', '.join(map(str, sources))} (the new ones after its own in "
                             f"each file) would not verify, so nothing was written: "
                             f"{str(error).replace(str(scratch), str(into))}") from None
        written = 0
        try:
            for path in added:
                with atomic_path(path) as part:
                    shutil.copyfile(Path(scratch) / path.relative_to(into), part)
                written += 1
        except OSError as error:  # a disk that fills, an attribute set since the check: say where it stopped
            raise UsageError(f"{into}: {path} could not be written ({error}) after {written} of the {len(added)} "
                             "files were: the collection is half-published and fails verify until publish is run "
                             "again, which completes it") from None
    return sorted(added)

"""``bench publish``: the rows of finished stores added to a collection (:mod:`bench.store.collection`), writing only
the files of the methods whose rows it adds: a new method is a new file, the others keep their bytes, so a commit of it
adds only the new rows' bytes to the repository's history.
"""

from __future__ import annotations

import gzip
import json
import shutil
import tempfile
from pathlib import Path

from artifacts.files import atomic_path
from runtime.errors import UsageError

from .collection import PACK, STORE_FILES, group_folder, method_folder, stores_below
from .copies import batch_difference, row_values
from .result_store import open_stores
from .row_fields import CONTEXT_SHA, describe_row, row_key
from .store_checks import check_stores


def _pack(rows: list[dict]) -> bytes:
    """A store file of ``rows``: the same rows give the same bytes (no time in the gzip header)."""
    return gzip.compress("".join(json.dumps(row) + "\n" for row in rows).encode(), mtime=0)


def publish(sources: list[Path], into: Path) -> list[Path]:
    """Add every row of the stores ``sources`` (each whole, as ``bench verify`` checks it) that the collection
    ``into`` lacks; returns the files written. A row it holds with the same values is left (a no-prune row every run
    answers alike); one it holds with other values is refused, naming it. The collection with the new rows is checked
    whole (every context of every group with every method) before a file of it is written."""
    if any((into / name).exists() for name in STORE_FILES):
        raise UsageError(f"--into {into} is a result store (it holds its own results file), not a collection of "
                         "them; give the collection's folder (docs/results)")
    opened = open_stores(list(sources))
    check_stores(opened)
    held = open_stores(stores_below(into)) if into.is_dir() else []
    files: dict[Path, list[dict]] = {store.path: list(store.rows) for store in held}
    known = {row_key(row): row for rows in files.values() for row in rows}
    added: dict[Path, list[dict]] = {}
    for row in (r for store in opened for r in store.rows):
        old = known.get(row_key(row))
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
        if path.exists() and path not in files:
            raise UsageError(f"{path} is not a store of this collection's (unreadable): restore it from version "
                             "control")
        added.setdefault(path, []).append(row)
        known[row_key(row)] = row
    if not added:
        return []
    with tempfile.TemporaryDirectory(prefix="publish-") as scratch:  # the collection as it will be, checked first
        for path, rows in {**files, **{p: files.get(p, []) + rows for p, rows in added.items()}}.items():
            target = Path(scratch) / path.relative_to(into).parent / PACK
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(_pack(rows))
        check_stores(open_stores(stores_below(Path(scratch))))
        for path in added:
            with atomic_path(path) as part:
                shutil.copyfile(Path(scratch) / path.relative_to(into), part)
    return sorted(added)

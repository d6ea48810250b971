"""Probe 11: files the bench writes and reads back (a model evaluation's rows, a leaderboard's page, tables and
manifest, a store's summary.md, curves.png and their SHA-256 records, a store's lock) made 20 GB files (sparse: no
disk spent) were read whole, ending the run in ``MemoryError``. Each is refused in one line naming the file, its
size, its bound and the remedy, before it is read (:mod:`runtime.bounded_read`)."""

import fcntl

import pytest

from artifacts.files import rebuilt_path
from bench.reports.leaderboard import read_manifest, sha256_of
from bench.reports.verify import _check_text
from bench.run.model_eval import not_evaluation_rows
from bench.store.store_lock import lock_holder, take_lock
from runtime.bounded_read import METADATA_LIMIT, REPORT_LIMIT, FileTooLargeError
from tests.runtime.test_file_bounds import _sparse, _too_large

LEADERBOARD_REMEDY = r"move it aside, then run `bench leaderboard` again$"


def test_evaluation_rows(tmp_path):
    path = _sparse(tmp_path / "rows.jsonl", REPORT_LIMIT + 1)
    with pytest.raises(FileTooLargeError, match=_too_large(path, REPORT_LIMIT) + "move it away, or give --rows"):
        not_evaluation_rows(path)


def test_leaderboard_files(tmp_path):
    page = _sparse(tmp_path / "leaderboard.md", REPORT_LIMIT + 1)
    with pytest.raises(FileTooLargeError, match=_too_large(page, REPORT_LIMIT) + LEADERBOARD_REMEDY):
        sha256_of(page)
    with pytest.raises(FileTooLargeError, match=_too_large(page, REPORT_LIMIT) + LEADERBOARD_REMEDY):
        _check_text(page, "rebuilt\n")
    manifest = _sparse(tmp_path / "leaderboard.sha256", METADATA_LIMIT + 1)
    with pytest.raises(FileTooLargeError, match=_too_large(manifest, METADATA_LIMIT) + LEADERBOARD_REMEDY):
        read_manifest(manifest)


@pytest.mark.parametrize("big", ["summary.md", ".summary.md.sha256"])
def test_rebuilt_files(tmp_path, big):
    """The file a run rebuilds, or its record, too large: refused, and the file is left where it was."""
    (tmp_path / "summary.md").write_text("old\n")
    (tmp_path / ".summary.md.sha256").write_text("0" * 64 + "\n")
    limit = REPORT_LIMIT if big == "summary.md" else METADATA_LIMIT
    path = _sparse(tmp_path / big, limit + 1)
    with pytest.raises(FileTooLargeError, match=_too_large(path, limit) + r"move it away \(the command writes"):
        with rebuilt_path(tmp_path / "summary.md", log=lambda line: None) as scratch:
            scratch.write_text("new\n")
    assert path.stat().st_size == limit + 1


def test_store_lock(tmp_path):
    """A lock held by another writer, its file too large to be one the bench wrote: the reader and the writer refuse."""
    lock = _sparse(tmp_path / ".lock", METADATA_LIMIT + 1)
    with open(lock, "a+") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        for check in (lock_holder, take_lock):
            with pytest.raises(FileTooLargeError, match=_too_large(lock, METADATA_LIMIT) + r"move it away \(bench"):
                check(tmp_path)

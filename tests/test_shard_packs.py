"""``scripts/shard_packs.py``: a sweep's shards carried between sessions only ever gain rows (probe 61: a `pack` of
an older local copy replaced 8 committed rows by 2, and `unpack` had skipped the shard without a word)."""

import gzip
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from bench.store.project_modules import ROOT

SCRIPT = ROOT / "scripts" / "shard_packs.py"
spec = importlib.util.spec_from_file_location("shard_packs", SCRIPT)
shard_packs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(shard_packs)

ROWS = b"".join(b'{"row": %d}\n' % k for k in range(8))


def _store(root, rows: bytes, packed: bool = False):
    store = root / "sweep2k" / "shard0"
    store.mkdir(parents=True, exist_ok=True)
    for name in ("results.jsonl", "results.jsonl.gz"):
        (store / name).unlink(missing_ok=True)
    if packed:
        (store / "results.jsonl.gz").write_bytes(gzip.compress(rows, mtime=0))
    else:
        (store / "results.jsonl").write_bytes(rows)
    return store


def _packed(kept) -> bytes:
    return gzip.decompress((kept / "sweep2k" / "shard0" / "results.jsonl.gz").read_bytes())


def test_pack_then_unpack_carries_the_rows_and_packs_the_same_bytes_twice(tmp_path):
    out, kept, elsewhere = tmp_path / "out", tmp_path / "kept", tmp_path / "next-session"
    _store(out, ROWS)
    assert "8 rows packed" in shard_packs.pack(out, kept)[0]
    first = (kept / "sweep2k" / "shard0" / "results.jsonl.gz").read_bytes()
    assert "unchanged" in shard_packs.pack(out, kept)[0]
    assert (kept / "sweep2k" / "shard0" / "results.jsonl.gz").read_bytes() == first
    assert "8 rows unpacked" in shard_packs.unpack(elsewhere, kept)[0]
    assert shard_packs.stored_bytes(elsewhere / "sweep2k" / "shard0") == ROWS


def test_an_older_copy_never_replaces_the_committed_rows(tmp_path):
    out, kept = tmp_path / "out", tmp_path / "kept"
    _store(out, ROWS)
    shard_packs.pack(out, kept)
    _store(out, ROWS[: ROWS.index(b"\n", 20) + 1])  # an older, shorter copy of the shard
    with pytest.raises(shard_packs.Diverged, match="rows do not continue .*nothing was packed. Run `unpack` first"):
        shard_packs.pack(out, kept)
    assert _packed(kept) == ROWS
    assert "rows unpacked over an older copy of 2" in shard_packs.unpack(out, kept)[0]
    assert shard_packs.stored_bytes(out / "sweep2k" / "shard0") == ROWS


def test_a_store_that_went_on_is_kept_and_packs_its_new_rows(tmp_path):
    out, kept = tmp_path / "out", tmp_path / "kept"
    _store(out, ROWS)
    shard_packs.pack(out, kept)
    more = ROWS + b'{"row": 8}\n'
    _store(out, more)
    assert "kept (9 rows, the pack's 8 and more)" in shard_packs.unpack(out, kept)[0]
    assert "(1 new)" in shard_packs.pack(out, kept)[0] and _packed(kept) == more


def test_a_store_and_a_pack_that_went_apart_are_left_as_they_are(tmp_path):
    out, kept = tmp_path / "out", tmp_path / "kept"
    _store(out, ROWS)
    shard_packs.pack(out, kept)
    other = b'{"row": "other"}\n'
    store = _store(out, other)
    for step in (shard_packs.pack, shard_packs.unpack):
        with pytest.raises(shard_packs.Diverged, match="nothing was"):
            step(out, kept)
    assert _packed(kept) == ROWS and (store / "results.jsonl").read_bytes() == other


def test_a_resumed_committed_store_packs_its_every_row(tmp_path):
    """A store resumed from a committed .gz holds results.jsonl (the .gz's rows and the new ones) beside it."""
    out, kept = tmp_path / "out", tmp_path / "kept"
    store = _store(out, ROWS, packed=True)
    (store / "results.jsonl").write_bytes(ROWS + b'{"row": 8}\n')
    shard_packs.pack(out, kept)
    assert _packed(kept) == ROWS + b'{"row": 8}\n'


def test_the_command_line_refuses_in_one_line_and_exit_2(tmp_path):
    out, kept = tmp_path / "out", tmp_path / "kept"
    _store(out, ROWS)
    shard_packs.pack(out, kept)
    _store(out, b'{"row": "other"}\n')
    done = subprocess.run([sys.executable, SCRIPT, "pack", out, kept], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "nothing was packed" in done.stderr


def test_a_row_being_written_is_not_packed(tmp_path):
    """A pack taken while the sweep writes holds whole lines only: the resumed store drops a cut last line, and
    would no longer continue a pack that held it."""
    out, kept = tmp_path / "out", tmp_path / "kept"
    _store(out, ROWS + b'{"row": 8, "cut')
    shard_packs.pack(out, kept)
    assert _packed(kept) == ROWS
    _store(out, ROWS + b'{"row": 8}\n')
    assert "(1 new)" in shard_packs.pack(out, kept)[0]


def test_an_unpack_waits_until_the_stores_writer_stops(tmp_path):
    """Probe 62: an unpack over an older copy replaced the file a running sweep appended to, whose next rows then
    landed in a new file of their own. While the store's lock is held it is refused, nothing written."""
    from bench.store.result_store import ResultStore

    out, kept = tmp_path / "out", tmp_path / "kept"
    _store(out, ROWS)
    shard_packs.pack(out, kept)
    store = _store(out, ROWS[:11])
    writer = ResultStore(store)
    try:
        with pytest.raises(shard_packs.Refused, match=f"unpack: {store} is being written by another process "
                                                      f"\\(pid {os.getpid()}\\).*nothing was unpacked"):
            shard_packs.unpack(out, kept)
        assert (store / "results.jsonl").read_bytes() == ROWS[:11]
    finally:
        writer.close()
    assert "8 rows unpacked over an older copy of 1" in shard_packs.unpack(out, kept)[0]


@pytest.mark.parametrize("step", ["pack", "unpack"])
def test_a_directory_without_stores_is_named(tmp_path, step):
    """A mistyped OUT or KEPT once printed nothing and exited 0."""
    done = subprocess.run([sys.executable, SCRIPT, step, tmp_path / "typo", tmp_path / "kept-typo"],
                          capture_output=True, text=True)
    where = tmp_path / ("typo" if step == "pack" else "kept-typo")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"{step}: no {'store' if step == 'pack' else 'pack'} under {where}" in done.stderr


@pytest.mark.parametrize("damage", [lambda packed: packed[:-5], lambda packed: b"not gzip"])
@pytest.mark.parametrize("step", ["pack", "unpack"])
def test_a_damaged_pack_is_named_and_nothing_is_written(tmp_path, step, damage):
    out, kept = tmp_path / "out", tmp_path / "kept"
    _store(out, ROWS)
    shard_packs.pack(out, kept)
    pack = kept / "sweep2k" / "shard0" / "results.jsonl.gz"
    pack.write_bytes(damage(pack.read_bytes()))
    _store(out, ROWS + b'{"row": 8}\n' if step == "pack" else ROWS[:11])
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    done = subprocess.run([sys.executable, SCRIPT, step, out, kept], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"{pack}: not a complete gzip file" in done.stderr
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before


@pytest.mark.parametrize("link", [False, True])
def test_a_store_that_is_its_own_pack_is_refused(tmp_path, link):
    """Probe 63: OUT and KEPT one directory (or KEPT's shard a link to OUT's): unpack removed both files before
    copying the pack, which was one of them — every row gone."""
    out = tmp_path / "out"
    store = _store(out, ROWS, packed=True)
    (store / "results.jsonl").write_bytes(ROWS + b'{"row": 8}\n')  # resumed from the .gz
    before = {path: path.read_bytes() for path in store.iterdir()}
    kept = out
    if link:
        kept = tmp_path / "kept"
        (kept / "sweep2k").mkdir(parents=True)
        (kept / "sweep2k" / "shard0").symlink_to(store)
    for step in (shard_packs.unpack, shard_packs.pack):
        with pytest.raises(shard_packs.Refused, match="nothing was (un)?packed"):
            step(out, kept)
    assert {path: path.read_bytes() for path in store.iterdir()} == before


def test_a_whole_last_row_without_its_newline_is_a_row(tmp_path):
    """Probe 63: it was taken for a cut line, the store for an older copy of the pack, and unpack dropped it."""
    out, kept = tmp_path / "out", tmp_path / "kept"
    _store(out, ROWS)
    shard_packs.pack(out, kept)
    store = _store(out, ROWS[:11] + b'{"row": "other"}')
    with pytest.raises(shard_packs.Diverged):
        shard_packs.unpack(out, kept)
    assert (store / "results.jsonl").read_bytes() == ROWS[:11] + b'{"row": "other"}'
    _store(out, ROWS + b'{"row": 8}')
    assert "9 rows packed" in shard_packs.pack(out, kept)[0] and _packed(kept) == ROWS + b'{"row": 8}'


def test_a_pack_with_a_cut_last_line_is_carried_after_its_resume(tmp_path):
    """Probe 63: a resume drops the pack's cut last line; pack and unpack then called the store and the pack
    apart, as the store itself no longer does."""
    out, kept = tmp_path / "out", tmp_path / "kept"
    _store(out, ROWS + b'{"row": 8, "cu')
    shard_packs.pack(out, kept)
    pack = kept / "sweep2k" / "shard0" / "results.jsonl.gz"
    pack.write_bytes(gzip.compress(ROWS + b'{"row": 8, "cu', mtime=0))  # as a gzip of a killed run's file
    _store(out, ROWS + b'{"row": 8}\n{"row": 9}\n')  # resumed: the cut line dropped, two rows appended
    assert "(2 new)" in shard_packs.pack(out, kept)[0]
    assert "kept (10 rows" in shard_packs.unpack(out, kept)[0]


@pytest.mark.parametrize("step, block", [
    ("unpack", lambda out, kept: (out / "sweep2k").mkdir(parents=True) or (out / "sweep2k" / "shard1").write_text("x")),
    ("unpack", lambda out, kept: (out / "sweep2k" / "shard1" / "results.jsonl").mkdir(parents=True)),
    ("pack", lambda out, kept: (kept / "sweep2k" / "shard1" / "results.jsonl.gz").mkdir(parents=True)),
    ("pack", lambda out, kept: (kept / "sweep2k").mkdir(parents=True) or (kept / "sweep2k" / "shard1").write_text("x")),
])
def test_a_file_where_a_folder_belongs_is_named_before_anything_is_written(tmp_path, step, block):
    """Probe 63: a traceback after the shards before it had been written."""
    out, kept = tmp_path / "out", tmp_path / "kept"
    for k in (0, 1):
        store = out / "sweep2k" / f"shard{k}"
        store.mkdir(parents=True)
        (store / "results.jsonl").write_bytes(ROWS)
    if step == "unpack":
        shard_packs.pack(out, kept)
        shutil.rmtree(out)
    block(out, kept)
    before = {path: path.read_bytes() if path.is_file() else None for path in tmp_path.rglob("*")}
    done = subprocess.run([sys.executable, SCRIPT, step, out, kept], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "shard1" in done.stderr and f"nothing was {step}ed" in done.stderr
    assert {path: path.read_bytes() if path.is_file() else None for path in tmp_path.rglob("*")} == before


def test_a_live_store_that_does_not_continue_its_gz_is_not_packed(tmp_path):
    """Probe 64: pack took results.jsonl alone, said "2 rows packed", and left the .gz's rows out."""
    out, kept = tmp_path / "out", tmp_path / "kept"
    store = _store(out, ROWS[:22], packed=True)
    (store / "results.jsonl").write_bytes(ROWS[22:44])
    with pytest.raises(shard_packs.Diverged, match="results.jsonl does not continue .*results.jsonl.gz beside it"):
        shard_packs.pack(out, kept)
    assert not kept.exists()


@pytest.mark.parametrize("step", ["pack", "unpack"])
def test_two_shards_that_are_one_directory_are_refused(tmp_path, step):
    """Probe 64: shard1 a link to shard0 in OUT: unpack wrote shard 1's rows over shard 0's, and said both done."""
    out, kept = tmp_path / "out", tmp_path / "kept"
    _store(out, ROWS)
    shard_packs.pack(out, kept)
    (kept / "sweep2k" / "shard1").mkdir()
    (kept / "sweep2k" / "shard1" / "results.jsonl.gz").write_bytes(gzip.compress(b'{"row": "one"}\n', mtime=0))
    (out / "sweep2k" / "shard1").symlink_to("shard0")
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    with pytest.raises(shard_packs.Refused, match="are one directory \\(a link\\)"):
        getattr(shard_packs, step)(out, kept)
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before


def test_a_write_that_fails_is_one_line_naming_what_was_done_and_leaves_no_scratch(tmp_path, monkeypatch):
    """Probe 64: a full disk was a raw OSError, a 0-byte .partial left beside the packs."""
    import errno

    out, kept = tmp_path / "out", tmp_path / "kept"
    for k in (0, 1):
        (out / "sweep2k" / f"shard{k}").mkdir(parents=True)
        (out / "sweep2k" / f"shard{k}" / "results.jsonl").write_bytes(ROWS)
    real = os.replace
    calls = []

    def full(source, target):
        calls.append(target)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(source))
        real(source, target)

    monkeypatch.setattr(shard_packs.os, "replace", full)
    with pytest.raises(shard_packs.Refused, match="pack: cannot write .*shard1/results.jsonl.gz.partial \\(No space "
                                                  "left on device\\); done before it: .*shard0: 8 rows packed"):
        shard_packs.pack(out, kept)
    assert not list(kept.rglob("*.partial")) and _packed(kept) == ROWS


def test_a_pack_folder_linked_to_another_store_is_refused(tmp_path):
    """Probe 65: KEPT's shard1 a link to OUT's shard0: pack wrote shard 1's rows into shard 0 as its .gz."""
    out, kept = tmp_path / "out", tmp_path / "kept"
    for k in (0, 1):
        (out / "sweep2k" / f"shard{k}").mkdir(parents=True)
        (out / "sweep2k" / f"shard{k}" / "results.jsonl").write_bytes(ROWS[: 11 * (k + 1)])
    (kept / "sweep2k").mkdir(parents=True)
    (kept / "sweep2k" / "shard1").symlink_to(out / "sweep2k" / "shard0")
    with pytest.raises(shard_packs.Refused, match="are one directory \\(a link\\)"):
        shard_packs.pack(out, kept)
    assert not (out / "sweep2k" / "shard0" / "results.jsonl.gz").exists()


def test_a_sweep_folder_linked_to_another_before_its_shards_exist_is_refused(tmp_path):
    """Probe 66: KEPT/sweepA a link to KEPT/sweepB with no shard folder there yet: pack wrote sweepB's rows over
    sweepA's pack."""
    out, kept = tmp_path / "out", tmp_path / "kept"
    for sweep in ("sweepA", "sweepB"):
        (out / sweep / "shard0").mkdir(parents=True)
        (out / sweep / "shard0" / "results.jsonl").write_bytes(ROWS[:11] if sweep == "sweepA" else ROWS)
    (kept / "sweepB").mkdir(parents=True)
    (kept / "sweepA").symlink_to("sweepB")
    with pytest.raises(shard_packs.Refused, match="are one directory \\(a link\\)"):
        shard_packs.pack(out, kept)
    assert not list(kept.rglob("*.gz"))


@pytest.mark.parametrize("make", [lambda path: path.mkdir(), os.mkfifo])
def test_a_store_file_that_is_a_folder_or_a_pipe_is_named_not_skipped(tmp_path, make):
    """Probe 67: a shard whose results.jsonl was a folder was skipped in silence and the others packed (exit 0)."""
    out, kept = tmp_path / "out", tmp_path / "kept"
    store = _store(out, ROWS)
    (store / "results.jsonl").unlink()
    make(store / "results.jsonl")
    other = shutil.copytree(_store(tmp_path / "other", ROWS), out / "sweep2k" / "shard1")
    assert other.is_dir()
    with pytest.raises(shard_packs.Refused, match=f"{store / 'results.jsonl'} is not a file: nothing was packed"):
        shard_packs.pack(out, kept)
    assert not kept.exists()

"""Bounded gunzip (:mod:`runtime.gunzip`) against ``gzip.decompress``, and the readers that use it (probe 9: a gzip
bomb as a store's committed rows or a haystack snapshot ended in MemoryError)."""

import gzip
import os

import pytest

from bench.store import result_store
from runtime.errors import UsageError
from runtime.gunzip import GunzipLimitError, gunzip


@pytest.mark.parametrize("make", [lambda: b"", lambda: b"row\n" * 5000, lambda: os.urandom(3 << 20)],
                         ids=["empty", "rows", "incompressible"])
def test_gunzip_equals_gzip_decompress_members_and_padding_included(make):
    data = make()
    packed = gzip.compress(data)
    assert gunzip(packed, 10 << 20) == gzip.decompress(packed) == data
    assert gunzip(packed + b"\0" * 8 + gzip.compress(b"more"), 10 << 20) == data + b"more"
    assert gunzip(b"", 1) == b""


@pytest.mark.parametrize("bad, raised", [(b"no gzip at all", OSError), (gzip.compress(b"x" * 999)[:-12], EOFError)],
                         ids=["no gzip", "cut short"])
def test_gunzip_names_damage_as_gzip_does(bad, raised):
    with pytest.raises(raised):
        gzip.decompress(bad)
    with pytest.raises(raised):
        gunzip(bad, 10 << 20)


def test_gunzip_stops_at_its_bound_before_unpacking_the_rest():
    bomb = gzip.compress(bytes(64 << 20))  # 64 MiB of zeros in ~64 KB
    with pytest.raises(GunzipLimitError, match="unpacks to more than 4 MiB"):
        gunzip(bomb, 4 << 20)


def test_a_store_whose_rows_unpack_past_the_bound_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(result_store, "STORE_LIMIT", 1 << 20)
    (tmp_path / "results.jsonl.gz").write_bytes(gzip.compress(b"\n" * (4 << 20)))
    with pytest.raises(UsageError, match=r"results.jsonl.gz: unpacks to more than 1 MiB, past what a store holds: no "
                                         r"store the bench wrote"):
        result_store.ResultStore._read(tmp_path / "results.jsonl.gz")


def test_a_snapshot_that_unpacks_past_the_bound_is_one_line(tmp_path, monkeypatch):
    from workloads import haystacks

    path = tmp_path / "manpages.jsonl.gz"
    path.write_bytes(gzip.compress(b" " * (4 << 20)))
    monkeypatch.setattr(haystacks, "SNAPSHOT_LIMIT", 1 << 20)
    monkeypatch.setattr(haystacks, "snapshot_path", lambda source: path)
    haystacks.snapshot.cache_clear()
    try:
        with pytest.raises(UsageError, match=r"its snapshot .* is damaged \(unpacks to more than 1 MiB\)"):
            haystacks.snapshot("manpages")
    finally:
        haystacks.snapshot.cache_clear()

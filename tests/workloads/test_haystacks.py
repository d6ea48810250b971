"""The shipped real-text haystacks (workloads.haystacks): one text per (source, task, item, seed) on every machine;
a snapshot is built from a source's files by path hash, so a machine with one file more picks the same documents;
a missing or damaged snapshot is one clear error."""

import gzip
import json
import random

import pytest

import workloads.corpus
from workloads import haystacks
from workloads.corpus import TextSource


@pytest.fixture
def fake_source(tmp_path, monkeypatch):
    """The ``manpages`` source pointed at a folder of ten small documents; returns the folder."""
    folder = tmp_path / "man"
    folder.mkdir()
    for i in range(10):
        (folder / f"page{i}.1").write_text(" ".join(f"Page {i} says thing number {j} about tools." for j in range(80)))
    sources = dict(workloads.corpus._TEXT_SOURCES)
    sources["manpages"] = TextSource(lambda: sorted(folder.glob("*")))
    monkeypatch.setattr(workloads.corpus, "_TEXT_SOURCES", sources)
    for cached in (workloads.corpus.source_files, workloads.corpus.documents, workloads.corpus.read_document):
        cached.cache_clear()
    yield folder
    for cached in (workloads.corpus.source_files, workloads.corpus.documents, workloads.corpus.read_document):
        cached.cache_clear()


def _read(path):
    return [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines()]


def test_a_snapshot_keeps_the_documents_of_lowest_path_hash_and_their_first_sentences(fake_source, tmp_path):
    out = haystacks.build("manpages", tmp_path / "a.jsonl.gz", keep=4)
    docs = _read(out)
    ranked = sorted((str(p) for p in fake_source.glob("*")), key=haystacks._rank)
    assert [d["path"] for d in docs] == sorted(ranked[:4])
    assert all(len(d["sentences"]) == haystacks.SENTENCES_PER_DOCUMENT for d in docs)
    assert docs[0]["sentences"][0].startswith(f"Page {docs[0]['path'][-3]} says thing number 0")
    assert out.read_bytes() == haystacks.build("manpages", tmp_path / "b.jsonl.gz", keep=4).read_bytes()
    # one file more on this machine: the snapshot keeps its documents unless the new one ranks among them
    (fake_source / "extra.1").write_text("An extra page that says one thing about tools. " * 40)
    workloads.corpus.source_files.cache_clear()
    workloads.corpus.documents.cache_clear()
    again = [d["path"] for d in _read(haystacks.build("manpages", tmp_path / "c.jsonl.gz", keep=4))]
    new = str(fake_source / "extra.1")
    assert set(again) - {new} <= {d["path"] for d in docs} and len(set(again) & {d["path"] for d in docs}) >= 3


def test_sentences_read_the_snapshot_only(tmp_path, monkeypatch):
    snapshot = tmp_path / "manpages.jsonl.gz"
    snapshot.write_bytes(gzip.compress(b"".join(json.dumps({"path": f"/d{i}", "sentences": [f"D{i} s{j}." for j in
                                                                                              range(3)]}).encode()
                                                 + b"\n" for i in range(2))))
    monkeypatch.setattr(haystacks, "SNAPSHOTS", tmp_path)
    haystacks.snapshot.cache_clear()
    try:
        drawn = haystacks.sentences("manpages", 7, random.Random(0))
        assert len(drawn) == 7 and drawn == haystacks.sentences("manpages", 7, random.Random(0))
        # a document from its first sentence on, then the next drawn document
        assert drawn[0].endswith("s0.") and drawn[3].endswith("s0.") and drawn[6].endswith("s0.")
        snapshot.write_bytes(snapshot.read_bytes()[:20])
        haystacks.snapshot.cache_clear()
        with pytest.raises(ValueError, match=r"haystack 'manpages': its snapshot .* is damaged .* restore it from git"):
            haystacks.check_haystack("manpages")
        snapshot.unlink()
        haystacks.snapshot.cache_clear()
        with pytest.raises(ValueError, match=r"snapshot .* is missing: restore it from git"):
            haystacks.sentences("manpages", 3, random.Random(0))
    finally:
        haystacks.snapshot.cache_clear()


def test_the_shipped_snapshots_are_what_their_sizes_say():
    for source, keep in haystacks.DOCUMENTS.items():
        docs = haystacks.snapshot(source)
        assert 0 < len(docs) <= keep and [p for p, _ in docs] == sorted(p for p, _ in docs)
        assert all(0 < len(s) <= haystacks.SENTENCES_PER_DOCUMENT for _, s in docs)
        assert all(12 <= len(sentence) <= 400 and sentence.isascii() for _, s in docs for sentence in s)


def _write_snapshot(path, documents):
    path.write_bytes(gzip.compress(b"".join(json.dumps(d).encode() + b"\n" for d in documents)))


@pytest.mark.parametrize("damage", ["fifo", "device link", "folder", "numbers", "not a list", "not an object",
                                    "blanks", "zero-width spaces", "NULs"])
def test_a_snapshot_that_is_no_file_of_documents_of_texts_is_refused_in_one_line(tmp_path, monkeypatch, damage):
    """Re-probe of 64: a snapshot made a pipe or a link to /dev/zero was read for ever (no refusal, no end); one
    whose sentences are numbers reached the tokenizer (a TypeError after the model was loaded); one of blank
    sentences made contexts of the needle alone under the haystack's name. Probe 8: so did sentences of zero-width
    spaces or NULs, which are not whitespace (a sentence without a letter or digit is blank)."""
    import os

    snapshot = tmp_path / "manpages.jsonl.gz"
    if damage == "fifo":
        os.mkfifo(snapshot)
    elif damage == "device link":
        snapshot.symlink_to("/dev/zero")
    elif damage == "folder":
        snapshot.mkdir()
    else:
        sentences = {"numbers": [1, 2, 3], "not a list": "One sentence here.", "not an object": None,
                     "blanks": ["", " "], "zero-width spaces": ["\u200b", "\u200b\u200b"],
                     "NULs": ["\x00", "\x00 \x00"]}[damage]
        _write_snapshot(snapshot, [{"path": "/d0", "sentences": ["A first sentence of prose."]},
                                   {"path": "/d1", "sentences": sentences} if sentences else ["/d1"]])
    monkeypatch.setattr(haystacks, "SNAPSHOTS", tmp_path)
    haystacks.snapshot.cache_clear()
    said = "not a regular file|a folder" if damage in ("fifo", "device link", "folder") else "is damaged"
    try:
        with pytest.raises(ValueError, match=rf"snapshot.*({said})"):
            haystacks.check_haystack("manpages")
    finally:
        haystacks.snapshot.cache_clear()


def test_a_data_file_that_is_no_regular_file_is_refused_before_it_is_hashed(tmp_path):
    """The snapshots' bytes are part of every group's code: a pipe in their place is refused, not read for ever."""
    import os

    from bench.store.code_version import data_digest

    (tmp_path / "workloads" / "haystacks").mkdir(parents=True)
    os.mkfifo(tmp_path / "workloads" / "haystacks" / "manpages.jsonl.gz")
    with pytest.raises(ValueError, match="manpages.jsonl.gz: not a regular file, where a data file of the project"):
        data_digest(tmp_path)

"""Probe 11: files of the checkout, a model or the machine that were still read whole (a distilled delta's manifest,
an estimator's settings and a conversion's record; a served model's config.json; an SCBench JSONL file; a haystack's
packed snapshot; a corpus document). A file past its bound (sparse: no disk spent) is refused in one line naming it,
its size, its bound and the remedy, before it is read; a corpus document that large is passed over as no document."""

import re

import pytest

from hybridmodel import delta_artifacts, hybrid_delta
from runtime.bounded_read import METADATA_LIMIT, FileTooLargeError
from serving import rules
from tests.runtime.test_file_bounds import _sparse, _too_large
from workloads import corpus, haystacks
from workloads.tasks import scbench


def test_a_delta_manifest_and_an_estimators_settings(tmp_path):
    manifest = _sparse(tmp_path / "delta" / hybrid_delta.MANIFEST_FILE, METADATA_LIMIT + 1)
    with pytest.raises(FileTooLargeError, match=_too_large(manifest, METADATA_LIMIT) + "restore the delta"):
        hybrid_delta.manifest(tmp_path / "delta")
    settings = _sparse(tmp_path / "model" / delta_artifacts.ARTIFACT_DIR / "gatesight.json", METADATA_LIMIT + 1)
    with pytest.raises(FileTooLargeError, match=_too_large(settings, METADATA_LIMIT) + "train the estimator again"):
        delta_artifacts.check_estimator_weights(tmp_path / "model", "0" * 12, "the hybrid")


@pytest.mark.parametrize("ask", [lambda d: rules.check_model(d, "float32"), rules.has_experts, rules.is_multimodal])
def test_a_served_models_config(tmp_path, ask):
    config = _sparse(tmp_path / "config.json", METADATA_LIMIT + 1)
    with pytest.raises(FileTooLargeError, match=_too_large(config, METADATA_LIMIT) + "give the model's own"):
        ask(tmp_path)


def test_an_scbench_file(tmp_path, monkeypatch):
    monkeypatch.setattr(scbench, "FILE_LIMIT", 1 << 20)  # the real bound, 2 GiB, read whole before the fix
    path = _sparse(tmp_path / "scbench_kv.jsonl", (1 << 20) + 1)
    with pytest.raises(FileTooLargeError, match=_too_large(path, 1 << 20) + "give SCBench's own scbench_kv.jsonl"):
        scbench.load_rows("kv", tmp_path)


def test_a_haystack_snapshot(tmp_path, monkeypatch):
    """The packed snapshot is bounded before it is read, as what it unpacks to is."""
    monkeypatch.setattr(haystacks, "SNAPSHOTS", tmp_path)
    path = _sparse(tmp_path / "manpages.jsonl.gz", haystacks.SNAPSHOT_LIMIT + 1)
    haystacks.snapshot.cache_clear()
    try:
        with pytest.raises(ValueError, match=re.escape(f"haystack 'manpages': its snapshot {path} is damaged ({path}: "
                                                       f"holds {haystacks.SNAPSHOT_LIMIT + 1:,} bytes, more than")):
            haystacks.snapshot("manpages")
    finally:
        haystacks.snapshot.cache_clear()


@pytest.mark.parametrize("name", ["page.1", "page.1.gz"])
def test_a_corpus_document_past_its_bound_is_no_document(tmp_path, monkeypatch, name):
    """Packed or not (a gzip member that unpacks past the bound too); a document within it is read."""
    import gzip

    text = ".SH NAME\n" + "words of a manual page " * 40 + "\n"
    path = tmp_path / name
    write = (lambda data: path.write_bytes(gzip.compress(data))) if name.endswith(".gz") else path.write_bytes
    write(text.encode())
    corpus.read_document.cache_clear()
    assert corpus.read_document("manpages", path) is not None
    monkeypatch.setattr(corpus, "DOCUMENT_LIMIT", len(text) - 1)
    corpus.read_document.cache_clear()
    assert corpus.read_document("manpages", path) is None
    corpus.read_document.cache_clear()

"""Probe 10: a JSON record, a model's settings or a store's rows made a 20 GB file (sparse: no disk spent) was read
whole, and the run ended in ``MemoryError`` — or, without a cap on its memory, drew the out-of-memory killer. Each is
refused in one line naming the file, its size and its bound, before it is read (:mod:`runtime.bounded_read`); a
recorded model's files are compared with their record's sizes before any is read. The files here are sparse, one
byte past their bound: refused by their size, never read."""

import re

import pytest

from allocators.head_shares import HeadShares
from bench.store.carried_codes import read_records
from bench.store.result_store import STORE_LIMIT, ResultStore
from presses.gatesight import GateSightEstimator
from pretrained import file_reads, model_files
from pretrained.file_record import read_record
from pretrained.fingerprints import fingerprint
from pretrained.model_cache import SOURCE_FILE, check_recorded, file_records, read_source
from pretrained.model_files import check_artifact, check_json_files, read_config
from runtime.bounded_read import METADATA_LIMIT, TOKENIZER_LIMIT, FileTooLargeError, read_bounded
from runtime.errors import UsageError
from tests.helpers import copy_model


def _sparse(path, size: int):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as file:
        file.truncate(size)
    return path


def _too_large(path, limit: int) -> str:
    """The start of the refusal of ``path``, ``limit + 1`` bytes."""
    bound = (f"{limit >> 30} GiB" if limit % (1 << 30) == 0 else f"{limit >> 20} MiB" if limit % (1 << 20) == 0
             else f"{limit:,} bytes")
    return "^" + re.escape(f"{path}: holds {limit + 1:,} bytes, more than the {bound} such a file "
                           "may hold; ")


def test_a_file_past_its_bound_is_refused_by_its_size(tmp_path):
    path = _sparse(tmp_path / "big.json", 1025)
    with pytest.raises(FileTooLargeError, match=_too_large(path, 1024) + "remedy$"):
        read_bounded(path, 1024, "remedy")
    assert read_bounded(_sparse(tmp_path / "small.json", 1024), 1024, "remedy") == b"\0" * 1024


def test_a_device_is_bounded_as_it_is_read(tmp_path):
    """``/dev/zero`` says it holds nothing and never ends: one byte past the bound is read, no more."""
    with pytest.raises(FileTooLargeError, match=re.escape("/dev/zero: holds more than 1,024 bytes as it is read "
                                                          "(a file that grows, or a device); remedy")):
        read_bounded("/dev/zero", 1024, "remedy")


def test_head_shares(tmp_path):
    _sparse(tmp_path / "calibration" / "head_shares.json", METADATA_LIMIT + 1)
    with pytest.raises(UsageError, match=_too_large(tmp_path / "calibration" / "head_shares.json", METADATA_LIMIT)
                       + re.escape(f"run `bench calibrate-shares --model {tmp_path} --replace`") + "$"):
        HeadShares.load(tmp_path)


def test_an_estimators_settings_and_an_artifact(tmp_path):
    path = _sparse(tmp_path / "gatesight.json", METADATA_LIMIT + 1)
    with pytest.raises(UsageError, match=_too_large(path, METADATA_LIMIT) + "train the estimator again"):
        GateSightEstimator.load(tmp_path)
    with pytest.raises(UsageError, match=_too_large(path, METADATA_LIMIT) + "make the artifact again"):
        check_artifact(path)


def test_a_collections_carried_groups(tmp_path):
    path = _sparse(tmp_path / "carried.json", METADATA_LIMIT + 1)
    with pytest.raises(UsageError, match=_too_large(path, METADATA_LIMIT) + "restore it from version control$"):
        read_records(path)


def test_a_plain_store(tmp_path):
    """A plain store is bounded as a compressed one unpacks (``STORE_LIMIT``)."""
    path = _sparse(tmp_path / "results.jsonl", STORE_LIMIT + 1)
    with pytest.raises(UsageError, match=_too_large(path, STORE_LIMIT) + "no store the bench wrote holds that much"):
        ResultStore(tmp_path, readonly=True)


def test_a_model_folders_records(tmp_path):
    _sparse(tmp_path / "files.json", METADATA_LIMIT + 1)
    with pytest.raises(UsageError, match=_too_large(tmp_path / "files.json", METADATA_LIMIT)):
        read_record(tmp_path)
    _sparse(tmp_path / SOURCE_FILE, METADATA_LIMIT + 1)
    with pytest.raises(UsageError, match=re.escape(
            f"{tmp_path / SOURCE_FILE}: the record of the model's conversion holds {METADATA_LIMIT + 1:,} bytes, "
            "more than the 64 MiB such a file may hold; remedy")):
        read_source(tmp_path, "remedy")


@pytest.mark.parametrize("name, limit", [("config.json", METADATA_LIMIT), ("generation_config.json", METADATA_LIMIT),
                                         ("tokenizer_config.json", TOKENIZER_LIMIT),
                                         ("chat_template.jinja", TOKENIZER_LIMIT)])
def test_a_model_folders_settings_and_tokenizer(model_dir, tmp_path, name, limit):
    copy = copy_model(model_dir, tmp_path)
    config = read_config(copy)
    _sparse(copy / name, limit + 1)
    said = _too_large(copy / name, limit) + "copy it again from where the model came from$"
    if name == "config.json":
        with pytest.raises(UsageError, match=said):
            read_config(copy)
    elif name.endswith(".json"):
        with pytest.raises(UsageError, match=said):
            check_json_files(copy, config)
    with pytest.raises(UsageError, match=said):
        fingerprint(copy, "tokenizer" if name.startswith(("tokenizer", "chat")) else "config")


def test_a_weight_index(model_dir, tmp_path):
    copy = copy_model(model_dir, tmp_path)
    _sparse(copy / "model.safetensors.index.json", METADATA_LIMIT + 1)
    with pytest.raises(UsageError, match=_too_large(copy / "model.safetensors.index.json", METADATA_LIMIT)):
        model_files.part_files(copy, "weights")


def test_a_recorded_models_sizes_are_compared_before_any_file_is_read(model_dir, tmp_path, monkeypatch):
    """The cached model's config.json, of another size than its conversion recorded, is named by its size: read whole
    first (for the weights' fingerprint), a 20 GB one ended the run in ``MemoryError``."""
    copy = copy_model(model_dir, tmp_path)
    (copy / "files.json").unlink(missing_ok=True)
    (copy / SOURCE_FILE).write_text('{"files": %s}' % __import__("json").dumps(file_records(copy)))
    recorded = (copy / "config.json").stat().st_size
    _sparse(copy / "config.json", METADATA_LIMIT + 1)
    read = []
    for module in (file_reads, model_files):
        monkeypatch.setattr(module, "read_whole", lambda path, *a, **k: read.append(path) or b"{}")
    with pytest.raises(UsageError, match=re.escape(f"is damaged: config.json is {METADATA_LIMIT + 1} bytes, its "
                                                   f"conversion wrote {recorded}; run `bench fetch-model")):
        check_recorded(copy, "tiny")
    assert read == []

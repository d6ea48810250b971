"""Probe 8: JSON nested 200000 deep, or holding an integer of 5000 digits, in a file the user can edit (an estimator's
settings, a calibration's metadata, a model folder's records, a collection's carried.json, a store's row, head
shares) ended the run in a raw ``RecursionError`` or ``ValueError``. Each reader takes it as the bad JSON it is: its
own one line, or — where bad JSON is read as none (a store's line, a conversion's record) — that."""

import re

import pytest

from allocators.head_shares import HeadShares
from bench.store.carried_codes import read_records
from bench.store.legacy_rows import not_a_row
from bench.store.result_store import ResultStore
from presses.artifact_contents import calibration_contents
from presses.gatesight import GateSightEstimator
from pretrained.file_record import read_record
from pretrained.model_cache import read_source
from pretrained.model_files import check_artifact, parse_config
from runtime.errors import UsageError
from runtime.json_text import JSONLimitError, parse_json
from tests.helpers import copy_model, run_cli

PAYLOADS = {"nested": "[" * 200000 + "]" * 200000, "a long integer": "[" + "7" * 5000 + "]"}
"""The probe's two texts: JSON too deep for Python's parser, and an integer past its 4300-digit limit."""
REASONS = {"nested": "nested deeper than Python parses", "a long integer": "an integer of more than 4300 digits"}
"""What :func:`runtime.json_text.parse_json` says of each."""

pytestmark = pytest.mark.parametrize("payload", sorted(PAYLOADS))


def _refusal(message: str) -> str:
    return "^" + re.escape(message) + "$"


def test_the_parser_names_the_limit_as_bad_json(payload):
    with pytest.raises(JSONLimitError) as caught:
        parse_json(PAYLOADS[payload])
    assert str(caught.value) == REASONS[payload] and isinstance(caught.value, ValueError)
    with pytest.raises(JSONLimitError):
        parse_json(PAYLOADS[payload].encode())


def test_an_estimators_settings(tmp_path, payload):
    (tmp_path / "gatesight.json").write_text(PAYLOADS[payload])
    with pytest.raises(UsageError, match=_refusal(f"{tmp_path / 'gatesight.json'}: not valid JSON "
                                                  f"({REASONS[payload]})")):
        GateSightEstimator.load(tmp_path)


def test_an_artifacts_json_and_a_models_config(tmp_path, payload):
    path = tmp_path / "config.json"
    path.write_text(PAYLOADS[payload])
    said = _refusal(f"{path}: not valid JSON ({REASONS[payload]})")
    with pytest.raises(UsageError, match=said):
        check_artifact(path)
    with pytest.raises(UsageError, match=said):
        parse_config(path, path.read_bytes())


@pytest.mark.parametrize("key", ["gate_weights", "tokens"])
def test_a_calibrations_metadata(tmp_path, payload, key):
    meta = {"gate_weights": "{}", "tokens": "5", "sources": "[]", key: PAYLOADS[payload]}
    with pytest.raises(UsageError, match=re.escape(f"{tmp_path}: its metadata {key} is not JSON "
                                                   f"({REASONS[payload]}); ")):
        calibration_contents(meta, {}, tmp_path)


def test_a_model_folders_record_of_its_files(tmp_path, payload):
    (tmp_path / "files.json").write_text(PAYLOADS[payload])
    with pytest.raises(UsageError, match=re.escape(f"{tmp_path / 'files.json'} is not a record of the model's files")):
        read_record(tmp_path)


def test_a_conversions_record_is_refused(tmp_path, payload):
    """As a source.json that is not JSON: refused with the remedy, never taken for no record (probe 9)."""
    (tmp_path / "source.json").write_text(PAYLOADS[payload])
    with pytest.raises(UsageError, match="the record of the model's conversion cannot be read .*; remedy$"):
        read_source(tmp_path, "remedy")


def test_a_collections_carried_groups(tmp_path, payload):
    path = tmp_path / "carried.json"
    path.write_text(PAYLOADS[payload])
    with pytest.raises(UsageError, match=_refusal(f"{path}: not a record of carried groups ({REASONS[payload]}); "
                                                  "restore it from version control")):
        read_records(path)


def test_a_stores_line_is_no_row(tmp_path, payload):
    """A line that is no row is named by every check of the store (verify, leaderboard, a resume)."""
    (tmp_path / "results.jsonl").write_text(PAYLOADS[payload] + "\n")
    assert ResultStore(tmp_path, readonly=True).skipped == [(1, not_a_row(None))]


def test_head_shares(tmp_path, payload):
    path = tmp_path / "calibration" / "head_shares.json"
    path.parent.mkdir()
    path.write_text(PAYLOADS[payload])
    with pytest.raises(UsageError, match=re.escape(f"{path}: not valid JSON ({REASONS[payload]}); run `bench "
                                                   "calibrate-shares")):
        HeadShares.load(tmp_path)


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "generation_config.json",
                                  "special_tokens_map.json"])
def test_a_json_file_transformers_reads_from_a_model_folder(model_dir, tmp_path, capsys, no_model_load, payload, name):
    """Probe 9: ``--model PATH`` whose tokenizer_config.json or tokenizer.json was nested 200000 deep ended in a
    ``RecursionError`` inside transformers' own ``json.load``. Every JSON file it reads from the folder is parsed
    first, named in one line before the model loads or anything is written."""
    copy = copy_model(model_dir, tmp_path)
    (copy / "files.json").unlink(missing_ok=True)  # a folder of the user's, which records none of its files
    (copy / name).write_text(PAYLOADS[payload])
    code, err = run_cli(capsys, "compare", "--model", copy, "--out", tmp_path / "out")
    assert code == 2 and err.endswith(f"{copy / name}: not valid JSON ({REASONS[payload]}); copy it again from "
                                      "where the model came from"), err
    assert not (tmp_path / "out").exists()

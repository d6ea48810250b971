"""A model folder's record of its own files (``files.json``): a damaged record is refused, never taken for none."""

import json
import shutil

import pytest

import pretrained.file_record
import pretrained.model_spec
from pretrained.file_record import RECORD_FILE, read_record
from pretrained.model_spec import DEFAULT_MODEL_DIR, MODEL_ENV
from runtime.errors import UsageError
from tests.helpers import run_cli


def _remove(record):
    record.unlink()


def _empty(record):
    record.write_text("")


def _no_files(record):
    record.write_text(json.dumps({"files": {}}))


def _partial(record):
    files = json.loads(record.read_text())["files"]
    del files["model.safetensors"]
    record.write_text(json.dumps({"files": files}))


def _folder(record):
    record.unlink()
    record.mkdir()


def _link(record):
    """A link to a record of the weights as they are now (the damaged ones): trusted, it would pass them."""
    other = record.parent.parent / "other.json"
    files = json.loads(record.read_text())["files"]
    weights = record.parent / "model.safetensors"
    files["model.safetensors"]["sha256"] = pretrained.file_record.sha256_of(weights)
    other.write_text(json.dumps({"files": files}))
    record.unlink()
    record.symlink_to(other)


DAMAGE = {"removed": (_remove, "files.json is missing: the checkout ships this folder"),
          "emptied": (_empty, "files.json is not a record of the model's files"),
          "no files": (_no_files, "files.json does not record "),
          "partial": (_partial, "files.json does not record model.safetensors, a file that makes the model"),
          "folder": (_folder, "files.json is a folder, where the record of the model's files belongs"),
          "link": (_link, "files.json is a link, where the record of the model's files belongs")}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_shipped_folder_whose_record_is_damaged_is_refused_never_trusted(tmp_path, monkeypatch, capsys, damage):
    """Re-probe of 64: the default model with its weights overwritten in place and its files.json removed, emptied,
    cut to some files, made a folder or a link to a record of the changed weights ran under its name, the folder
    taken for one that records nothing. Each is one line naming the record and `git checkout` as the way back."""
    copy = tmp_path / "models" / DEFAULT_MODEL_DIR.name
    shutil.copytree(DEFAULT_MODEL_DIR, copy)
    monkeypatch.setattr(pretrained.model_spec, "DEFAULT_MODEL_DIR", copy)
    monkeypatch.setattr(pretrained.file_record, "CHECKOUT", tmp_path)  # the copy ships in this "checkout"
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2:len(data) // 2 + 4096] = b"\x7f" * 4096
    weights.write_bytes(bytes(data))
    spoil, said = DAMAGE[damage]
    spoil(copy / RECORD_FILE)
    code, err = run_cli(capsys, "compare", "--press", "snapkv", "--n", "1", "--out", tmp_path / "out")
    assert code == 2 and said in err, err
    assert "run `git checkout -- models/hybrid-byte-12l` to restore" in err, err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_a_folder_of_ones_own_without_a_record_is_not_checked_one_with_a_partial_record_is_refused(tmp_path):
    """Outside the checkout's shipped folders a record is optional (a model a user copied in keeps none), but one
    that is there covers every file that makes the model."""
    copy = tmp_path / "mine"
    shutil.copytree(DEFAULT_MODEL_DIR, copy)
    (copy / RECORD_FILE).unlink()
    assert read_record(copy) is None
    pretrained.file_record.write_record(copy)
    assert set(read_record(copy)) >= {"model.safetensors", "config.json", "tokenizer.json"}
    _partial(copy / RECORD_FILE)
    with pytest.raises(UsageError, match="does not record model.safetensors.*restore it from where it was copied"):
        read_record(copy)


@pytest.mark.parametrize("name", ["hybrid-byte-12l", "smollm2-135m-instruct"])
def test_a_folder_named_as_a_catalogued_model_that_records_nothing_is_refused(tmp_path, capsys, name):
    """The re-probe of 64: a cached conversion with its source.json removed and its weights damaged, given by its
    path, ran under the catalogue's name (rows are named after the folder). A folder bearing that name must record
    its files; under another name it runs as the user's own model."""
    copy = tmp_path / name
    shutil.copytree(DEFAULT_MODEL_DIR, copy)
    (copy / RECORD_FILE).unlink()
    code, err = run_cli(capsys, "compare", "--model", copy, "--press", "snapkv", "--n", "1", "--out", tmp_path / "out")
    assert code == 2 and f"--model {copy}: the folder is named {name}, the model its rows would be named" in err, err
    assert not (tmp_path / "out").exists()
    mine = copy.rename(tmp_path / "mine")
    code, err = run_cli(capsys, "compare", "--model", mine, "--press", "snapkv", "--n", "1", "--tasks", "niah_single_1",
                        "--length", "300", "--out", tmp_path / "out")
    assert code == 0, err


def test_the_default_model_named_by_the_variable_that_records_nothing_is_refused(tmp_path, capsys, monkeypatch):
    """Probe 12: a damaged copy of the default model without its files.json, named by HYBRIDPRESS_MODEL, ran as
    hybrid-byte-12l, though the same folder given with --model is refused: one rule for both."""
    copy = tmp_path / DEFAULT_MODEL_DIR.name
    shutil.copytree(DEFAULT_MODEL_DIR, copy)
    (copy / RECORD_FILE).unlink()
    monkeypatch.setenv(MODEL_ENV, str(copy))
    monkeypatch.setattr(pretrained.model_spec, "DEFAULT_MODEL_DIR", copy)  # as the variable makes it at import
    code, err = run_cli(capsys, "compare", "--press", "snapkv", "--n", "1", "--out", tmp_path / "out")
    assert code == 2 and err == (
        f"bench compare: error: {MODEL_ENV}={copy}: the folder is named {copy.name}, the model its rows would be named "
        f"after, but records none of its files (source.json, files.json), so its weights could be any: unset "
        f"{MODEL_ENV} (the default model ships in the checkout), or copy the model into a folder of another name"), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["hybrid-byte-12l", "smollm2-135m-instruct"])
@pytest.mark.parametrize("tail", ["", "/", "/."])
def test_a_link_named_as_a_catalogued_model_to_a_folder_that_records_nothing_is_refused(tmp_path, capsys, name, tail):
    """Probe 8, item 5: a link named like a catalogued model, to an unrecorded folder of another name, ran under the
    catalogue's name (rows are named after the path given; the check looked at the folder the link leads to). The
    check now looks at the rows' name, so a link is refused as a folder so named, and a link of another name to a
    folder so named runs under the link's name, as its rows say."""
    mine = tmp_path / "mine"
    shutil.copytree(DEFAULT_MODEL_DIR, mine)
    (mine / RECORD_FILE).unlink()
    (tmp_path / "links").mkdir()
    link = tmp_path / "links" / name
    link.symlink_to(mine)
    code, err = run_cli(capsys, "compare", "--model", f"{link}{tail}", "--press", "snapkv", "--n", "1",
                        "--out", tmp_path / "out")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"--model {link}: the folder is named {name}, the model its rows would be named" in err, err
    assert not (tmp_path / "out").exists()
    named = mine.rename(tmp_path / name)
    (tmp_path / "links" / "other").symlink_to(named)
    assert pretrained.model_spec.resolve(str(tmp_path / "links" / "other")).name == "other"


@pytest.mark.parametrize("artifact", ["gatesight/gatesight.safetensors", "calibration/calibration.safetensors"])
def test_a_shipped_artifact_changed_in_place_is_refused(tmp_path, monkeypatch, capsys, artifact):
    """Probe 7: 4 KiB of the default model's estimator zeroed (finite values its loader takes) ran as gatesight,
    its rows apart only by their artifacts' fingerprint. The shipped record holds the artifacts too."""
    copy = tmp_path / "models" / DEFAULT_MODEL_DIR.name
    shutil.copytree(DEFAULT_MODEL_DIR, copy)
    monkeypatch.setattr(pretrained.model_spec, "DEFAULT_MODEL_DIR", copy)
    monkeypatch.setattr(pretrained.file_record, "CHECKOUT", tmp_path)
    path = copy / artifact
    data = bytearray(path.read_bytes())
    data[len(data) // 2:len(data) // 2 + min(4096, len(data) // 4)] = bytes(min(4096, len(data) // 4))
    path.write_bytes(bytes(data))
    code, err = run_cli(capsys, "compare", "--press", "snapkv", "--n", "1", "--out", tmp_path / "out")
    assert code == 2 and f"is damaged: {artifact} has SHA-256 " in err and "git checkout -- models/" in err, err


@pytest.mark.slow  # ~3 s: it calibrates a copy of the shipped model; CI's slow run holds it
def test_a_command_that_replaces_an_artifact_records_the_folder_again(tmp_path, capsys):
    """calibrate-shares into a copy of the default model (with its record): the record is written again, and the
    folder runs."""
    copy = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL_DIR, copy)
    before = read_record(copy)["calibration/head_shares.json"]
    code, err = run_cli(capsys, "calibrate-shares", "--model", copy, "--windows", "2", "--tokens", "256", "--replace")
    assert code == 0, err
    assert read_record(copy)["calibration/head_shares.json"] != before
    code, err = run_cli(capsys, "compare", "--model", copy, "--methods", "snapkv/head_shares", "--tasks",
                        "niah_single_1", "--n", "1", "--length", "300", "--out", tmp_path / "out")
    assert code == 0, err


def test_a_recorded_file_made_a_pipe_is_named_so(tmp_path, monkeypatch, capsys):
    """Probe 7: the shipped model's config.json made a pipe was said to be "missing"."""
    import os

    copy = tmp_path / "models" / DEFAULT_MODEL_DIR.name
    shutil.copytree(DEFAULT_MODEL_DIR, copy)
    monkeypatch.setattr(pretrained.model_spec, "DEFAULT_MODEL_DIR", copy)
    monkeypatch.setattr(pretrained.file_record, "CHECKOUT", tmp_path)
    (copy / "generation_config.json").unlink()
    os.mkfifo(copy / "generation_config.json")
    code, err = run_cli(capsys, "compare", "--press", "snapkv", "--n", "1", "--out", tmp_path / "out")
    assert code == 2 and "generation_config.json" in err and "not a regular file" in err, err


def _flip(path, at: int = -1) -> None:
    """One byte of ``path`` changed in place, its size kept: only its hash tells."""
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_recording_again_keeps_the_models_files_and_records_the_new_artifact(model_dir, tmp_path):
    copy = shutil.copytree(model_dir, tmp_path / "model")
    pretrained.file_record.write_record(copy)
    before = read_record(copy)
    (copy / "calibration" / "head_shares.json").write_text((copy / "calibration" / "head_shares.json").read_text()
                                                           + "\n")
    pretrained.file_record.record_again(copy)
    after = read_record(copy)
    assert after.pop("calibration/head_shares.json") != before.pop("calibration/head_shares.json")
    assert after == before


def test_weights_changed_while_a_command_ran_are_never_recorded(model_dir, tmp_path):
    """Probe 10: weights overwritten while calibrate-shares ran were recorded (files.json re-hashed every file), and
    the folder then ran silently under its name with other weights. The record is left as it was, and the folder is
    refused as damaged until restored."""
    copy = shutil.copytree(model_dir, tmp_path / "model")
    pretrained.file_record.write_record(copy)
    record = (copy / RECORD_FILE).read_bytes()
    _flip(copy / "model.safetensors")
    (copy / "calibration" / "head_shares.json").write_text("{}")
    with pytest.raises(UsageError, match=f"^{copy}: model.safetensors changed while the command ran \\(has SHA-256 "
                                         "[0-9a-f]{64}, not the recorded [0-9a-f]{64}\\): what it wrote was made from "
                                         "other files than those recorded, so the record is not written again; "):
        pretrained.file_record.record_again(copy)
    assert (copy / RECORD_FILE).read_bytes() == record


def test_calibrate_shares_writes_nothing_where_the_weights_change_while_it_runs(model_dir, tmp_path, capsys,
                                                                                monkeypatch):
    """The probe's race, its bytes flipped while the first window is scored: nothing is written, neither the shares
    (measured on the weights as loaded) nor the record."""
    import gatesight_learning.head_shares as calibration

    copy = shutil.copytree(model_dir, tmp_path / "model")
    pretrained.file_record.write_record(copy)
    kept = {path: path.read_bytes() for path in (copy / RECORD_FILE, copy / "calibration" / "head_shares.json")}
    measured = calibration.window_shares

    def flipped_while_measuring(*args, **kwargs):
        if not getattr(flipped_while_measuring, "done", False):
            _flip(copy / "model.safetensors")
            flipped_while_measuring.done = True
        return measured(*args, **kwargs)

    monkeypatch.setattr(calibration, "window_shares", flipped_while_measuring)
    code, err = run_cli(capsys, "calibrate-shares", "--model", copy, "--windows", "2", "--tokens", "256",
                        "--replace")
    assert code == 2 and f"{copy}: its weights changed while the head shares were measured (fingerprint " in err, err
    assert "nothing was written" in err
    assert {path: path.read_bytes() for path in kept} == kept


def test_calibrate_writes_nothing_where_the_weights_change_while_it_runs(model_dir, tmp_path, capsys, monkeypatch):
    """As calibrate-shares: the weights flipped once the model is loaded, before the statistics are measured."""
    import gatesight_learning.calibrate as calibration

    copy = shutil.copytree(model_dir, tmp_path / "model")
    pretrained.file_record.write_record(copy)
    kept = {path: path.read_bytes() for path in [copy / RECORD_FILE, *(copy / "calibration").iterdir()]}
    measure = calibration.calibrate

    def flipped_while_measuring(*args, **kwargs):
        _flip(copy / "model.safetensors")
        return measure(*args, **kwargs)

    monkeypatch.setattr(calibration, "calibrate", flipped_while_measuring)
    code, err = run_cli(capsys, "calibrate", "--model", copy, "--tokens", "256", "--chunk", "128", "--replace")
    assert code == 2 and f"{copy}: its weights changed while the calibration was measured (fingerprint " in err, err
    assert "nothing was written" in err
    assert {path: path.read_bytes() for path in [copy / RECORD_FILE, *(copy / "calibration").iterdir()]} == kept

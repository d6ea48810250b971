"""A model folder's record of its own files (``files.json``): a damaged record is refused, never taken for none."""

import json
import shutil

import pytest

import pretrained.file_record
import pretrained.model_spec
from pretrained.file_record import RECORD_FILE, read_record
from pretrained.model_spec import DEFAULT_MODEL_DIR
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

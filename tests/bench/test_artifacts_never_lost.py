"""A model directory's derived artifacts (GateSight's estimator, the calibration) are never written over by a command
that did not write them in this run: refused before any work, or, with --replace, moved aside whole; every file
they and the label shards are written as has the mode the rest of the bench's files have; a trained model is never
written over by ``bench train-model`` unless told to, and a replaced one moves aside with its artifacts."""

import os
import shutil

import pytest

from bench.commands.cli import main
from presses.calibration import FILE
from pretrained import loading
from tests.helpers import run_cli

LABEL_ARGS = ["--limit", "2", "--tokens", "48", "--continuations", "1", "--max-new-tokens", "4"]


def _default_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _mode(path) -> int:
    return os.stat(path).st_mode & 0o777


@pytest.fixture
def model_copy(model_dir, tmp_path):
    """The tiny model with its estimator and calibration, in a directory of the test's own."""
    return shutil.copytree(model_dir, tmp_path / "model")


@pytest.fixture
def labels(model_dir, tmp_path):
    """Label shards of the tiny model: two windows, from two labelling sources."""
    out = tmp_path / "labels"
    assert main(["label", "--model", str(model_dir), "--out", str(out), *LABEL_ARGS]) == 0
    return out


def _snapshot(directory) -> dict:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir()) if path.is_file()}


def test_train_refuses_an_estimator_it_did_not_write_before_loading(model_copy, tmp_path, capsys, monkeypatch):
    before = _snapshot(model_copy / "gatesight")
    monkeypatch.setattr(loading, "load", lambda *a, **k: pytest.fail("the model loaded before the refusal"))
    for out in ([], ["--out", str(model_copy / "gatesight")]):  # the default --out is the model's own gatesight/
        code = main(["train", "--model", str(model_copy), "--labels", str(tmp_path / "labels"), "--epochs", "1", *out])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert f"{model_copy / 'gatesight' / 'gatesight.safetensors'} holds a GateSight estimator" in err
        assert "pass --replace" in err
    assert _snapshot(model_copy / "gatesight") == before


def test_train_replace_moves_the_old_estimator_aside(model_copy, labels, capsys):
    before = _snapshot(model_copy / "gatesight")
    assert main(["train", "--model", str(model_copy), "--labels", str(labels), "--epochs", "1", "--replace"]) == 0
    [backup] = model_copy.glob("gatesight.backup-*")
    assert f"to {backup}" in capsys.readouterr().out
    assert _snapshot(backup) == before  # every file the new estimator replaces, as it was
    after = _snapshot(model_copy / "gatesight")
    assert after["gatesight.safetensors"] != before["gatesight.safetensors"]
    assert all(_mode(path) == _default_mode() for path in (model_copy / "gatesight").iterdir())


def test_train_writes_a_fresh_out_without_replace(model_dir, labels, tmp_path):
    out = tmp_path / "estimator"
    assert main(["train", "--model", str(model_dir), "--labels", str(labels), "--epochs", "1", "--out", str(out)]) == 0
    assert {path.name for path in out.iterdir()} == {"gatesight.safetensors", "gatesight.json", "evaluation.md"}
    assert all(_mode(path) == _default_mode() for path in out.iterdir())
    assert not list(tmp_path.glob("estimator.backup-*"))


def test_calibrate_refuses_a_calibration_it_did_not_write(model_copy, capsys, monkeypatch):
    before = (model_copy / FILE).read_bytes()
    monkeypatch.setattr(loading, "load", lambda *a, **k: pytest.fail("the model loaded before the refusal"))
    code = main(["calibrate", "--model", str(model_copy), "--tokens", "256", "--chunk", "128"])
    err = capsys.readouterr().err
    assert code == 2 and f"{model_copy / FILE} holds a calibration that this run did not write" in err, err
    assert (model_copy / FILE).read_bytes() == before


def test_calibrate_replace_moves_the_old_calibration_aside(model_copy, capsys):
    before = (model_copy / FILE).read_bytes()
    assert main(["calibrate", "--model", str(model_copy), "--tokens", "256", "--chunk", "128", "--replace"]) == 0
    [backup] = model_copy.glob("calibration.backup-*")
    assert (backup / FILE.name).read_bytes() == before
    assert (model_copy / FILE).read_bytes() != before
    assert _mode(model_copy / FILE) == _default_mode()


def test_label_shards_have_the_default_mode(labels):
    shards = sorted(labels.glob("*.safetensors"))
    assert len(shards) == 2 and all(_mode(path) == _default_mode() for path in shards)



def test_a_replaced_model_moves_aside_with_its_artifacts(tiny, tmp_path):
    from hybridmodel.tokenizer import build_tokenizer
    from hybridmodel.train import save

    out = tmp_path / "model"
    (out / "gatesight").mkdir(parents=True)
    (out / "model.safetensors").write_bytes(b"old weights")
    (out / "gatesight" / "gatesight.safetensors").write_bytes(b"old estimator")
    (out / "calibration").mkdir()
    lines = []
    save(tiny("qwen3"), build_tokenizer(), out, {"steps_done": 1}, log=lines.append)
    (backup,) = tmp_path.glob("model.backup-*")
    assert (backup / "model.safetensors").read_bytes() == b"old weights"
    assert (backup / "gatesight" / "gatesight.safetensors").exists() and (backup / "calibration").is_dir()
    assert not (out / "gatesight").exists() and not (out / "calibration").exists()
    assert (out / "model.safetensors").stat().st_size > 1000 and str(backup) in lines[0]


def test_train_model_never_writes_over_a_trained_model(tmp_path, capsys, monkeypatch):
    from hybridmodel import train as training

    monkeypatch.setattr(training, "train", lambda *a, **k: pytest.fail("training started"))
    out, checkpoints = tmp_path / "model", tmp_path / "checkpoints"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"trained")
    for steps in ("0", "-3"):
        code, err = run_cli(capsys, "train-model", "--steps", steps, "--out", tmp_path / "fresh",
                         "--checkpoints", checkpoints)
        assert code == 2 and f"--steps {steps}: give a positive number of training steps" in err
    code, err = run_cli(capsys, "train-model", "--steps", 5, "--out", out, "--checkpoints", checkpoints)
    # no checkpoint there: --resume is not offered (followed, it was refused)
    assert code == 2 and f"{out} holds a trained model (model.safetensors); --checkpoints {checkpoints} holds no " \
                         "checkpoint to continue it from (last.pt); pass --replace" in err and "--resume" not in err
    code, err = run_cli(capsys, "train-model", "--resume", "--out", out, "--checkpoints", checkpoints)
    assert code == 2 and f"--resume: no checkpoint at {checkpoints / 'last.pt'}" in err
    checkpoints.mkdir()
    (checkpoints / "last.pt").write_bytes(b"a checkpoint")
    code, err = run_cli(capsys, "train-model", "--steps", 5, "--out", out, "--checkpoints", checkpoints)
    assert code == 2 and f"pass --resume to continue training it from {checkpoints / 'last.pt'}, or --replace" in err
    assert (out / "model.safetensors").read_bytes() == b"trained"
    with pytest.raises(ValueError, match="steps=0: expected an integer >= 1"):
        training.TrainConfig(steps=0)


def test_a_backup_is_never_named_over_a_link_that_leads_nowhere(tmp_path, monkeypatch):
    """Probe 8: a user's link that leads nowhere, named as the backup of an edited summary.md would be, was replaced
    by the backup (``exists()`` denies such a link); named as an artifact folder's backup, it made ``install`` (``cost
    --replace``) end in FileExistsError after the work. The backup takes the next free name; the link stays."""
    from types import SimpleNamespace

    from artifacts import files

    monkeypatch.setattr(files, "time", SimpleNamespace(strftime=lambda form: "20260101-000000"))
    summary = tmp_path / "summary.md"
    summary.write_text("edited by hand\n")
    target = tmp_path / "estimator"
    target.mkdir()
    (target / "a.json").write_text("old")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "a.json").write_text("new")
    links = [tmp_path / f"{name}.backup-20260101-000000" for name in ("summary.md", "estimator")]
    for link in links:
        link.symlink_to("nowhere")
    files.write_rebuilt(summary, "rebuilt\n", log=lambda line: None)
    files.install([scratch / "a.json"], target, log=lambda line: None)
    assert [os.readlink(link) for link in links] == ["nowhere", "nowhere"]
    assert (tmp_path / "summary.md.backup-20260101-000000-2").read_text() == "edited by hand\n"
    assert (tmp_path / "estimator.backup-20260101-000000-2" / "a.json").read_text() == "old"
    assert summary.read_text() == "rebuilt\n" and (target / "a.json").read_text() == "new"

"""Label shards record the settings that change their labels; a label directory is never resumed under other
settings, and ``bench train`` never fits one estimator to shards of different settings."""

import shutil

import pytest
from safetensors import safe_open
from safetensors.torch import save_file

from bench.cli import main
from gatesight_learning.record import shard_settings
from pretrained import loading

SMALL = ["--limit", "2", "--continuations", "1", "--max-new-tokens", "4"]


def _label(model_dir, out, *argv) -> int:
    return main(["label", "--model", str(model_dir), "--out", str(out), *SMALL, *argv])


def test_shards_record_their_settings_and_a_resume_under_others_is_refused(model_dir, tmp_path, capsys,
                                                                          monkeypatch):
    labels = tmp_path / "labels"
    assert _label(model_dir, labels, "--tokens", "48", "--part", "0/2") == 0
    [shard] = labels.glob("*.safetensors")
    recorded = shard_settings(shard)["settings"]
    assert recorded == {"tokens": 48, "continuations": 1, "max_new_tokens": 4, "seed": 0, "futures": "both"}
    written = shard.read_bytes()
    capsys.readouterr()
    monkeypatch.setattr(loading, "load", lambda *a, **k: pytest.fail("the model loaded before the refusal"))
    for other in (["--tokens", "40"], ["--tokens", "48", "--seed", "1"], ["--tokens", "48", "--continuations", "2"],
                  ["--tokens", "48", "--futures", "labels"]):
        code = _label(model_dir, labels, *other, "--part", "1/2")
        err = capsys.readouterr().err
        assert code == 2 and f"{shard} was labelled with other settings (tokens=48" in err, err
        assert "; this run: tokens=" in err and "label into a new --out directory" in err
    assert list(labels.glob("*.safetensors")) == [shard] and shard.read_bytes() == written


def test_the_same_settings_resume_and_say_what_they_reused(model_dir, tmp_path, capsys):
    labels = tmp_path / "labels"
    assert _label(model_dir, labels, "--tokens", "48", "--part", "0/2") == 0
    assert _label(model_dir, labels, "--tokens", "48") == 0
    assert "1 documents labelled" in capsys.readouterr().out.splitlines()[-1]
    assert len(list(labels.glob("*.safetensors"))) == 2


def test_a_shard_without_recorded_settings_is_not_resumed(model_dir, tmp_path, capsys):
    labels = tmp_path / "labels"
    assert _label(model_dir, labels, "--tokens", "48", "--limit", "1") == 0
    [shard] = labels.glob("*.safetensors")
    with safe_open(str(shard), "pt") as f:  # as shards were written before they recorded their settings
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    save_file(tensors, str(shard), metadata={k: v for k, v in meta.items() if k != "settings"})
    capsys.readouterr()
    assert _label(model_dir, labels, "--tokens", "48") == 2
    assert "settings not recorded" in capsys.readouterr().err


def test_train_refuses_shards_of_different_settings(model_dir, tmp_path, capsys):
    mixed = tmp_path / "mixed"
    assert _label(model_dir, tmp_path / "a", "--tokens", "48") == 0
    assert _label(model_dir, tmp_path / "b", "--tokens", "40") == 0
    mixed.mkdir()
    for source in ("a", "b"):
        for shard in sorted((tmp_path / source).glob("*.safetensors"))[:1]:
            shutil.copy(shard, mixed / f"{source}-{shard.name}")
    capsys.readouterr()
    code = main(["train", "--model", str(model_dir), "--labels", str(mixed), "--epochs", "1",
                 "--out", str(tmp_path / "estimator")])
    err = capsys.readouterr().err
    assert code == 2 and "tokens=40" in err and "tokens=48" in err, err
    assert "keep one setting's shards per directory" in err
    assert not (tmp_path / "estimator").exists()


def test_train_and_analyze_refuse_labels_of_other_weights(model_dir, tmp_path, capsys):
    """Labels describe the model that produced them: a copy of the model with one weight changed refuses them."""
    from safetensors.torch import load_file

    labels = tmp_path / "labels"
    assert _label(model_dir, labels, "--tokens", "48", "--limit", "1") == 0
    other = tmp_path / "other-model"
    shutil.copytree(model_dir, other, ignore=shutil.ignore_patterns("gatesight", "calibration"))
    [weights] = other.glob("model*.safetensors")
    tensors = load_file(str(weights))
    name = next(iter(tensors))
    tensors[name] = tensors[name] + 1.0
    save_file(tensors, str(weights), metadata={"format": "pt"})
    capsys.readouterr()
    for argv in (["train", "--epochs", "1", "--out", str(tmp_path / "estimator")],
                 ["analyze", "--out", str(tmp_path / "analysis")]):
        code = main([argv[0], "--model", str(other), "--labels", str(labels), *argv[1:]])
        err = capsys.readouterr().err
        labelled, this = (loading.fingerprint(d, "model*.safetensors") for d in (model_dir, other))
        assert code == 2 and f"{labels} was labelled by model weights {labelled}" in err, err
        assert f"not this model's ({this})" in err
    assert not (tmp_path / "estimator").exists() and not (tmp_path / "analysis").exists()


def test_label_refuses_a_group_of_no_windows_before_the_model_loads(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(loading, "load", lambda *a, **k: pytest.fail("the model loaded before the refusal"))
    assert _label(model_dir, tmp_path / "labels", "--together", "0") == 2
    assert "--together 0: label at least one window at a time" in capsys.readouterr().err
    assert not (tmp_path / "labels").exists()

"""Label shards record the settings that change their labels; a label directory is never resumed under other
settings, and ``bench train`` never fits one estimator to shards of different settings."""

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

import gatesight_learning.record
from bench.commands.cli import main
from gatesight_learning.shards import shard_settings
from pretrained import loading
from tests.helpers import run_cli, save_model, truncate

SMALL = ["--limit", "2", "--continuations", "1", "--max-new-tokens", "4"]


def _label(model_dir, out, *argv) -> int:
    """``bench label`` with :data:`SMALL`'s settings, a flag ``argv`` gives in place of SMALL's (a flag given twice
    is refused)."""
    small = [part for flag, value in zip(SMALL[::2], SMALL[1::2]) if flag not in argv for part in (flag, value)]
    return main(["label", "--model", str(model_dir), "--out", str(out), *small, *argv])


def test_shards_record_their_settings_and_a_resume_under_others_is_refused(model_dir, tmp_path, capsys,
                                                                          monkeypatch):
    labels = tmp_path / "labels"
    assert _label(model_dir, labels, "--tokens", "48", "--part", "0/2") == 0
    [shard] = labels.glob("*.safetensors")
    recorded = shard_settings(shard)["settings"]
    assert recorded == {"tokens": 48, "continuations": 1, "max_new_tokens": 4, "seed": 0, "futures": "both",
                        "dtype": "float32"}
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


@pytest.mark.slow  # ~4 s: it labels three times; CI's slow run holds it
def test_the_same_settings_resume_and_say_what_they_reused(model_dir, tmp_path, capsys):
    """The last line counts what this run labelled and gives the worst check error of those; a run that found
    every window labelled checked none, and says no error (probe 76: it said 0.00e+00, as if checked and exact)."""
    labels = tmp_path / "labels"
    assert _label(model_dir, labels, "--tokens", "48", "--part", "0/2") == 0
    assert _label(model_dir, labels, "--tokens", "48") == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("1 documents labelled") and "worst closed-form vs deletion error this run: " in last
    assert len(list(labels.glob("*.safetensors"))) == 2
    assert _label(model_dir, labels, "--tokens", "48") == 0
    assert capsys.readouterr().out.splitlines()[-1] == (f"0 documents labelled in {labels} (2 of this part's 2 "
                                                         "were there already)")


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
        labelled, this = (loading.fingerprint(d, "weights") for d in (model_dir, other))
        assert code == 2 and f"{labels} was labelled by model weights {labelled}" in err, err
        assert f"not this model's ({this})" in err
    assert not (tmp_path / "estimator").exists() and not (tmp_path / "analysis").exists()


def test_label_refuses_a_group_of_no_windows_before_the_model_loads(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(loading, "load", lambda *a, **k: pytest.fail("the model loaded before the refusal"))
    assert _label(model_dir, tmp_path / "labels", "--together", "0") == 2
    err = capsys.readouterr().err
    assert "--together" in err and ">= 1, got '0'" in err, err
    assert not (tmp_path / "labels").exists()


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory):
    """A tiny random dense Qwen3 (attention layers only) over the byte tokenizer."""
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, eos_token_id=257)
    return save_model(Qwen3ForCausalLM(config).eval(), tmp_path_factory.mktemp("dense"))


@pytest.fixture(scope="module")
def two_windows(model_dir, tmp_path_factory):
    """Label shards of two windows (of two corpora) of the tiny hybrid, float32."""
    labels = tmp_path_factory.mktemp("labels") / "float32"
    assert _label(model_dir, labels, "--tokens", "48") == 0
    return labels


def test_label_refuses_a_model_without_recurrent_layers(dense_dir, tmp_path, capsys):
    capsys.readouterr()
    assert _label(dense_dir, tmp_path / "labels", "--tokens", "48") == 2
    err = capsys.readouterr().err
    assert f"{dense_dir} has no recurrent layers (Qwen3ForCausalLM: attention layers only)" in err, err
    assert "GateSight's labels pair each attention layer's utilities with the GDN or Mamba2 signals" in err
    assert not (tmp_path / "labels").exists()


def test_shards_record_their_dtype_and_dtypes_are_never_mixed(model_dir, two_windows, tmp_path, capsys,
                                                              no_model_load):
    for shard in two_windows.glob("*.safetensors"):
        assert shard_settings(shard)["settings"]["dtype"] == "float32"
    capsys.readouterr()
    assert _label(model_dir, two_windows, "--tokens", "48", "--dtype", "bfloat16") == 2  # a resume in bfloat16
    err = capsys.readouterr().err
    assert "was labelled with other settings" in err and "dtype=float32" in err and "dtype=bfloat16" in err, err
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    first, second = sorted(two_windows.glob("*.safetensors"))
    shutil.copy(first, mixed / first.name)
    _relabel(second, mixed / second.name, dtype="bfloat16")
    for argv in (["train", "--out", str(tmp_path / "estimator")], ["analyze", "--out", str(tmp_path / "analysis")]):
        code = main([argv[0], "--model", str(model_dir), "--labels", str(mixed), *argv[1:]])
        err = capsys.readouterr().err
        assert code == 2 and "other settings" in err and "dtype=bfloat16" in err and "dtype=float32" in err, err
    assert not (tmp_path / "estimator").exists() and not (tmp_path / "analysis").exists()


def _relabel(shard, to, drop: str | None = None, **settings):
    """A copy of ``shard`` at ``to`` with ``settings`` changed in its record, its tensors named ``drop...`` left
    out."""
    with safe_open(str(shard), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys() if drop is None or not k.startswith(drop)}
        meta = f.metadata()
    meta["settings"] = json.dumps({**json.loads(meta["settings"]), **settings})
    save_file(tensors, str(to), metadata=meta)


@pytest.mark.parametrize("command", ["train", "analyze"])
def test_too_few_windows_are_refused_with_the_minimum(model_dir, two_windows, tmp_path, capsys, monkeypatch,
                                                      command):
    one = tmp_path / "one"
    one.mkdir()
    shard = sorted(two_windows.glob("*.safetensors"))[0]
    shutil.copy(shard, one / shard.name)
    capsys.readouterr()
    with monkeypatch.context() as patched:
        patched.setattr(loading, "load", lambda *a, **k: pytest.fail("the model loaded before the refusal"))
        assert main([command, "--model", str(model_dir), "--labels", str(one), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    needs = {"train": "at least 2 windows from at least 2 corpora (it is evaluated leave-one-corpus-out)",
             "analyze": "at least 2 windows (observation 1 correlates documents in pairs)"}[command]
    assert f"{one} holds 1 labelled window (of 1 corpus); {command} needs {needs}" in err, err
    assert not (tmp_path / "out").exists()
    fast = ["--epochs", "1"] if command == "train" else []
    assert main([command, "--model", str(model_dir), "--labels", str(two_windows), "--out", str(tmp_path / "out"),
                 *fast]) == 0  # the minimum is enough


@pytest.mark.parametrize("command", ["train", "analyze"])
def test_labels_without_recurrent_signals_are_refused(model_dir, two_windows, tmp_path, capsys, no_model_load,
                                                      command):
    """What ``bench label`` wrote on a dense model before it refused one: labels and no signals."""
    dense = tmp_path / "dense"
    dense.mkdir()
    for shard in two_windows.glob("*.safetensors"):
        _relabel(shard, dense / shard.name, drop="signals.")
    capsys.readouterr()
    assert main([command, "--model", str(model_dir), "--labels", str(dense), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{sorted(dense.glob('*.safetensors'))[0]} holds no recurrent-layer signals" in err, err
    assert "labelled on a model without recurrent layers" in err


def test_a_damaged_shard_is_named_by_label_train_and_analyze(model_dir, two_windows, tmp_path, capsys):
    labels = tmp_path / "labels"
    shutil.copytree(two_windows, labels)
    shard = sorted(labels.glob("*.safetensors"))[0]
    truncate(shard)
    damaged = shard.read_bytes()
    capsys.readouterr()
    for argv in (["label", "--tokens", "48", "--continuations", "1", "--max-new-tokens", "4", "--out", str(labels)],
                 ["train", "--labels", str(labels), "--out", str(tmp_path / "estimator")],
                 ["analyze", "--labels", str(labels), "--out", str(tmp_path / "analysis")]):
        code, err = run_cli(capsys, argv[0], "--model", model_dir, *argv[1:])
        assert code == 2 and f"{shard}: a damaged label shard (" in err, err
        assert "delete it and label again into the same --out" in err
    assert shard.read_bytes() == damaged


@pytest.mark.parametrize("argv, message, windows", [
    (["--tokens", "64"], "--tokens 64: no labelling document holds half a window of that many tokens", []),
    (["--tokens", "32768"], "--tokens 32768 and --max-new-tokens 4 need 32772 positions; the model has 32768", None),
])
def test_label_refuses_windows_it_cannot_label_instead_of_labelling_none(model_dir, tmp_path, capsys, monkeypatch,
                                                                         argv, message, windows):
    if windows is not None:  # a corpus none of whose documents is long enough for the window asked
        monkeypatch.setattr(gatesight_learning.record, "corpus_windows", lambda *args, **kwargs: windows)
    capsys.readouterr()
    assert _label(model_dir, tmp_path / "labels", *argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "labels").exists()


@pytest.mark.parametrize("command", ["train", "analyze"])
def test_missing_labels_advise_labelling_the_model_given(model_dir, tmp_path, capsys, command):
    """The advice named no --model: followed, it labelled the default model, whose labels this run then refuses."""
    (tmp_path / "empty").mkdir()
    code, err = run_cli(capsys, command, "--model", model_dir, "--labels", tmp_path / "empty", "--out",
                        tmp_path / "out")
    assert code == 2 and f"run `bench label --model {model_dir} --out {tmp_path / 'empty'}` first" in err, err


@pytest.mark.parametrize("tokens", ["1", "39"])
def test_windows_too_short_to_rank_are_refused_before_the_model_loads(tokens, model_dir, tmp_path, capsys,
                                                                       no_model_load):
    """Under 40 tokens a window cut to half holds no token of the top 5 % the labels are ranked by: every Ov/Cov
    would compare the whole window with itself (100 %), so label refuses it, naming the minimum."""
    assert _label(model_dir, tmp_path / "labels", "--tokens", tokens) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--tokens {tokens}: give at least 40 tokens per window" in err, err
    assert not (tmp_path / "labels").exists()


def test_a_label_setting_below_its_minimum_is_named_by_its_flag(model_dir, tmp_path, capsys, no_model_load):
    assert _label(model_dir, tmp_path / "labels", "--max-new-tokens", "1") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-new-tokens 1: give at least 2 " in err, err
    assert not (tmp_path / "labels").exists()


@pytest.mark.parametrize("command", ["train", "analyze"])
def test_a_distilled_delta_is_not_read_as_label_shards(command, model_dir, tmp_path, capsys, no_model_load):
    """A folder `bench distill --out` wrote (hybrid.json, mixers.safetensors) given as --labels: no shard there
    (shards are <corpus>--<doc>.safetensors) but a delta, not "labelled by model weights unknown"."""
    delta = tmp_path / "delta"
    delta.mkdir()
    (delta / "hybrid.json").write_text("{}")
    save_file({"w": torch.zeros(2)}, str(delta / "mixers.safetensors"))
    code, err = run_cli(capsys, command, "--model", model_dir, "--labels", delta, "--out", tmp_path / "out")
    assert code == 2 and f"--labels {delta}: holds a distilled hybrid's delta" in err and "unknown" not in err, err


@pytest.mark.parametrize("command", ["train", "analyze"])
def test_labels_that_are_another_commands_folder_are_named_so(command, model_dir, tmp_path, capsys, no_model_load):
    """--labels a result store: "run bench label --out STORE first" would be refused (one folder, one command's
    files), so the error says what the folder holds instead."""
    store = tmp_path / "store"
    store.mkdir()
    (store / "results.jsonl").write_text("")
    code, err = run_cli(capsys, command, "--model", model_dir, "--labels", store, "--out", tmp_path / "out")
    assert code == 2 and f"--labels {store}: holds a result store" in err and "bench label --model" not in err, err

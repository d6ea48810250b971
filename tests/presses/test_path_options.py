"""What the CLI hands a press as text: an artifact's directory (``gatesight[estimator=DIR]``,
``triattention[calibration=DIR]``) is loaded from there, or refused naming the directory before any model loads;
bracket options given to the library, a kept fraction given as text and a context longer than the model's positions
are each one error saying what to do instead."""

import json
import os
import re
import shutil

import pytest
import torch

import presses
from bench.run.cost import run_cost
from presses.calibration import Calibration
from presses.gatesight import GateSightEstimator, GateSightPress
from presses.triattention import TriAttentionPress
from runtime import prefill
from runtime.errors import MissingFileError, UsageError
from tests.helpers import run_cli


def test_an_estimator_directory_loads_the_estimator_saved_there(model_dir):
    saved = GateSightEstimator.load(model_dir / "gatesight")
    for given in (str(model_dir / "gatesight"), model_dir / "gatesight"):
        loaded = presses.get("gatesight", estimator=given).estimator
        assert loaded.gdn_layers == saved.gdn_layers and loaded.layers.keys() == saved.layers.keys()
        assert all(torch.equal(loaded.layers[layer][k], saved.layers[layer][k])
                   for layer in saved.layers for k in saved.layers[layer])


def test_a_calibration_directory_loads_the_calibration_saved_there(model_dir):
    saved = Calibration.load(model_dir)
    loaded = presses.get("triattention", calibration=str(model_dir)).calibration
    assert loaded.centres.keys() == saved.centres.keys()
    assert all(torch.equal(loaded.centres[layer], saved.centres[layer]) for layer in saved.centres)


@pytest.mark.parametrize("press, option, what", [
    (GateSightPress, "estimator", "no GateSight estimator there (no gatesight.json or gatesight.safetensors)"),
    (TriAttentionPress, "calibration", "no calibration there"),
])
def test_a_directory_without_the_artifact_is_named(tmp_path, press, option, what):
    with pytest.raises(UsageError, match=f"{option}='{tmp_path / 'nowhere'}': no such directory"):
        press(**{option: str(tmp_path / "nowhere")})
    with pytest.raises(UsageError, match=f"{option}='{tmp_path}': {what.replace('(', '.').replace(')', '.')}"):
        press(**{option: str(tmp_path)})
    with pytest.raises(UsageError, match=f"{option}=5: give a"):
        press(**{option: 5})


def test_a_calibration_directory_without_one_advises_what_works(model_dir, tmp_path, capsys):
    """`bench calibrate --model DIR` writes into a model directory DIR: advised for one, not for an empty folder
    (where it fails: no model there)."""
    from bench.commands.cli import main

    with pytest.raises(UsageError, match="it is not a model directory either: name the directory of a model that "
                                         "`bench calibrate --model DIR` has calibrated, or leave the option out"):
        TriAttentionPress(calibration=str(tmp_path))
    assert main(["calibrate", "--model", str(tmp_path)]) == 2  # the advice it gave before
    uncalibrated = tmp_path / "model"
    shutil.copytree(model_dir, uncalibrated, ignore=shutil.ignore_patterns("calibration*"))
    with pytest.raises(UsageError, match=f"run `bench calibrate --model {uncalibrated}`"):
        TriAttentionPress(calibration=str(uncalibrated))


@pytest.mark.parametrize("item", ["triattention[calibration={dir}]", "gatesight[estimator={dir}]"])
def test_the_cli_refuses_a_missing_artifact_directory_before_the_model_loads(model_dir, tmp_path, capsys,
                                                                            no_model_load, item):
    missing = tmp_path / "nowhere"
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--press", item.format(dir=missing), "--alloc",
                        "flat", "--out", tmp_path / "out")
    assert code == 2 and f"={str(missing)!r}: no such directory" in err, err


@pytest.mark.parametrize("item, folder, name", [("triattention[calibration={dir}]", "calibration", "calibration"),
                                               ("gatesight[estimator={dir}]", "gatesight", "gatesight")])
def test_an_artifact_larger_than_any_is_refused_before_it_is_mapped(model_dir, tmp_path, capsys, monkeypatch,
                                                                   no_model_load, item, folder, name):
    """Probe 13: a 20 GB (sparse) estimator under an address-space limit ended the run in ``MemoryError``, as
    safetensors maps a file whole to open it; its size is now said before anything maps or reads it."""
    import safetensors

    given = shutil.copytree(model_dir / folder, tmp_path / folder)
    os.truncate(given / f"{name}.safetensors", 20 << 30)

    def mapped(path, *args, **kwargs):
        pytest.fail(f"{path} was mapped before its size was checked")

    monkeypatch.setattr(safetensors, "safe_open", mapped)
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--press", item.format(dir=given), "--alloc", "flat",
                        "--out", tmp_path / "out")
    assert code == 2 and "\n" not in err, err  # one line (run_cli strips its end)
    assert err.endswith(f"{given / name}.safetensors: holds 21,474,836,480 bytes, more than the 4 GiB such a file "
                        "may hold; make the artifact again, or give its own"), err
    assert not (tmp_path / "out").exists()


def test_a_safetensors_file_past_the_address_space_is_one_error(model_dir, monkeypatch):
    """Under an address-space limit (``ulimit -v``) that a file's mapping passes, safetensors raises MemoryError."""
    import safetensors

    from pretrained.model_files import check_safetensors

    def no_room(path, *args, **kwargs):
        raise MemoryError("Cannot allocate memory (os error 12)")

    monkeypatch.setattr(safetensors, "safe_open", no_room)
    size = (model_dir / "model.safetensors").stat().st_size
    with pytest.raises(UsageError, match=re.escape(
            f"model.safetensors: its {size:,} bytes cannot be mapped in the address space this process may use")):
        check_safetensors(model_dir / "model.safetensors")


def test_a_kept_fraction_given_as_text_is_named_a_type_error(tiny):
    parent = prefill(tiny("qwen3_5"), torch.arange(40) % 97, protected=4)
    with pytest.raises(UsageError, match="keep fraction must be a number in \\(0, 1\\], got '0.5' \\(str\\)"):
        presses.compress(parent, "keydiff", "flat", keep_fraction="0.5")


def test_bracket_options_outside_bench_compare_say_how_to_give_them(model_dir, tmp_path):
    message = ("press 'snapkv\\[window=64\\]': options in brackets are bench compare's --press syntax; here name the "
               "press alone and give its options as keywords, presses.get\\('snapkv', key=value\\), or pass a Press "
               "instance, SnapKVPress\\(key=value\\)")
    with pytest.raises(UsageError, match=message):
        presses.get("snapkv[window=64]")
    with pytest.raises(UsageError, match="bench cost times each press with its default options; name it alone "
                                         "\\('snapkv'\\)"):
        run_cost(str(model_dir), ["snapkv[window=64]"], [64], tmp_path / "cost")
    assert not (tmp_path / "cost").exists()


def test_a_context_beyond_the_models_positions_says_so(model_dir, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    monkeypatch.setattr(model.config, "max_position_embeddings", 256)
    pipe = presses.pipeline(model, AutoTokenizer.from_pretrained(model_dir), max_new_tokens=8)
    with pytest.raises(UsageError, match="options in brackets"):
        pipe("Some facts.", "\nWhat?", press="snapkv[window=64]", keep_fraction=0.5)
    with pytest.raises(UsageError, match="the context alone takes \\d+ tokens of the model's 256 positions"):
        pipe("x" * 400, "\nWhat?", press="keydiff", keep_fraction=0.5)


def _trained_on(model_dir, out, weights: str):
    """The model's estimator, saved in ``out`` as recording that it was trained on the weights ``weights``."""
    estimator = GateSightEstimator.load(model_dir / "gatesight")
    estimator.meta["weights"] = weights
    return estimator.save(out)


def test_an_estimator_of_other_weights_is_refused_where_a_press_is_prepared(model_dir, tmp_path):
    """An estimator reads the signals of the weights it was trained on; prepare (and bind) refuse another's, naming
    both fingerprints, and take one trained on these weights."""
    from presses.preparation import prepare
    from pretrained import loading
    from runtime import adapter_for

    adapter = adapter_for(loading.load(model_dir)[0])
    weights = loading.fingerprint(model_dir, "weights")
    other = _trained_on(model_dir, tmp_path / "other", "0" * 12)
    for press in (GateSightPress(estimator=other), GateSightPress(estimator=GateSightEstimator.load(other))):
        with pytest.raises(UsageError, match=f"{other} was trained on model weights 000000000000, not this "
                                             f"model's \\({weights}\\): train one on this model"):
            prepare(press, adapter)
    own = _trained_on(model_dir, tmp_path / "own", weights)
    assert prepare(GateSightPress(estimator=own), adapter).estimator.meta["weights"] == weights


@pytest.mark.parametrize("own", [False, True])
def test_compare_refuses_an_estimator_of_other_weights_before_the_model_loads(model_dir, tmp_path, capsys,
                                                                             no_model_load, own):
    """Given as estimator=DIR, or the model's own gatesight/ copied from another model (then trained again there,
    with --replace)."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    estimator = _trained_on(model_dir, model / "gatesight" if own else tmp_path / "other", "0" * 12)
    item = "gatesight" if own else f"gatesight[estimator={estimator}]"
    code, err = run_cli(capsys, "compare", "--model", model, "--press", item, "--alloc", "flat", "--out",
                        tmp_path / "out")
    assert code == 2 and f"{estimator} was trained on model weights 000000000000, not this model's" in err, err
    assert f"bench train --model {model} --labels LABELS {'--replace' if own else '--out NEW_DIR'}" in err
    assert not (tmp_path / "out").exists()


def test_loading_an_estimator_from_a_directory_without_one_is_a_missing_file_usage_error(tmp_path):
    with pytest.raises(MissingFileError, match=re.escape(f"no GateSight estimator in {tmp_path / 'none'}: train")):
        GateSightEstimator.load(tmp_path / "none")


def test_a_calibration_of_other_model_weights_is_refused_and_one_without_the_record_passes(model_dir, tmp_path):
    """A calibration records the weights it was measured on; bound to a model with other weights it is refused
    naming both, as a GateSight estimator is; one saved before calibrations recorded them passes."""
    from transformers import AutoModelForCausalLM

    from presses.calibration import calibrate, weights_fingerprint
    from presses.preparation import prepare
    from runtime import adapter_for
    from tests.helpers import save_model

    mine, other = tmp_path / "mine", tmp_path / "other"
    shutil.copytree(model_dir, mine)
    model = AutoModelForCausalLM.from_pretrained(mine).eval()
    calibration = calibrate(model, [torch.arange(64)], ["bytes"])
    assert calibration.weights == weights_fingerprint(mine) is not None
    calibration.save(mine)
    assert Calibration.load(mine).weights == calibration.weights
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(1.5)
    save_model(model, other)
    theirs = adapter_for(AutoModelForCausalLM.from_pretrained(other).eval())
    with pytest.raises(UsageError, match=re.escape(f"the calibration in {mine} was measured on model weights "
                                                   f"{calibration.weights}, not this model's (")):
        prepare("triattention", theirs, calibration=str(mine))
    calibration.save(other)  # a stale calibration in the model's own directory
    with pytest.raises(UsageError, match=re.escape(f"the calibration in {other} was measured on model weights")):
        prepare("triattention", theirs)
    with pytest.raises(ValueError, match=re.escape(f"the calibration in {other} was measured on model weights")):
        Calibration.for_model(theirs)
    assert prepare("triattention", adapter_for(model), mine).calibration.weights == calibration.weights
    calibration.weights = None  # as calibrations were saved before they recorded the weights
    calibration.save(mine)
    assert prepare("triattention", theirs, calibration=str(mine)).calibration.weights is None


def test_weights_in_pytorch_files_are_checked_too(model_dir, tmp_path):
    """The weights are fingerprinted in every file a model directory loads them from (PyTorch's
    ``pytorch_model.bin`` too), not only ``model*.safetensors``: another model's calibration copied beside them is
    refused, where it was once taken for a model built in memory's."""
    from transformers import AutoModelForCausalLM

    from presses.calibration import calibrate, weights_fingerprint
    from presses.preparation import prepare
    from pretrained import loading
    from runtime import adapter_for
    from tests.helpers import save_model

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    calibration = calibrate(model, [torch.arange(64)], ["bytes"])
    assert calibration.weights == weights_fingerprint(model_dir) is not None
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(1.5)
    other = save_model(model, tmp_path / "other")
    (other / "model.safetensors").unlink()
    torch.save(model.state_dict(), other / "pytorch_model.bin")  # as older checkpoints arrive
    calibration.save(other)
    assert weights_fingerprint(other) == loading.identity(other).parts["weights"] != calibration.weights
    with pytest.raises(UsageError, match=re.escape(f"the calibration in {other} was measured on model weights "
                                                   f"{calibration.weights}, not this model's (")):
        prepare("triattention", adapter_for(loading.load(other)[0]))


def test_files_a_checkpoint_carries_beside_its_weights_are_not_weights(model_dir, tmp_path):
    """Probe 63: every top-level ``*.bin`` counted, so a ``training_args.bin`` added beside the weights made the
    model's own calibration "another model's"."""
    from transformers import AutoModelForCausalLM

    from presses.calibration import calibrate, weights_fingerprint
    from presses.preparation import prepare
    from pretrained import loading
    from runtime import adapter_for

    mine = shutil.copytree(model_dir, tmp_path / "mine")
    calibration = calibrate(AutoModelForCausalLM.from_pretrained(mine).eval(), [torch.arange(64)], ["bytes"])
    calibration.save(mine)
    for name in ("training_args.bin", "optimizer.bin", "adapter_model.safetensors"):
        (mine / name).write_bytes(b"not the model's weights")
    assert weights_fingerprint(mine) == calibration.weights == loading.identity(model_dir).parts["weights"]
    assert prepare("triattention", adapter_for(loading.load(mine)[0])).calibration.weights == calibration.weights


def _sharded(model, directory, prefix: str):
    """``model`` saved in shards named ``{prefix}-0000k.safetensors`` (``prefix`` may name a subfolder) and the
    index naming them, as transformers loads any shard its index names."""
    from tests.helpers import save_model

    save_model(model, directory)
    (directory / "model.safetensors").unlink()
    model.save_pretrained(directory, max_shard_size="20KB")
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    names = {old: f"{prefix}-{k:05d}.safetensors" for k, old in enumerate(sorted(set(index["weight_map"].values())))}
    for old, new in names.items():
        (directory / new).parent.mkdir(exist_ok=True)
        (directory / old).rename(directory / new)
    index["weight_map"] = {tensor: names[shard] for tensor, shard in index["weight_map"].items()}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return directory


@pytest.mark.parametrize("prefix", ["part", "sub/part"])
def test_shards_of_any_name_its_index_names_are_the_weights(model_dir, tmp_path, prefix):
    """Probe 64: shards named other than model*.safetensors fingerprinted as nothing, so other weights passed for
    the same model and a calibration went unchecked; probe 65: the same for shards in a subfolder, and such a model
    was refused as one without weights."""
    from transformers import AutoModelForCausalLM

    from bench.commands.arguments import model_spec
    from presses.calibration import weights_fingerprint
    from pretrained import loading

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    mine = _sharded(model, tmp_path / "mine", prefix)
    assert len(loading.part_files(mine, "weights")) > 2
    args = type("Args", (), {"model": str(mine), "device": "cpu", "dtype": "float32", "allow_download": False})
    assert model_spec(args).path == str(mine)
    (mine / "training_args.bin").write_bytes(b"not weights")  # counts neither as weights nor as their fingerprint
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(1.5)
    theirs = _sharded(model, tmp_path / "theirs", prefix)
    assert None != weights_fingerprint(mine) != weights_fingerprint(theirs) != None  # noqa: E711
    assert loading.identity(mine).weights != loading.identity(theirs).weights
    assert loading.load(mine)[0].model.embed_tokens.weight.shape == model.model.embed_tokens.weight.shape


def test_the_weight_file_a_config_names_is_the_weights(model_dir, tmp_path):
    """Probe 65: transformers loads the file ``transformers_weights`` names in place of model.safetensors; it
    fingerprinted as nothing."""
    from presses.calibration import weights_fingerprint
    from pretrained import loading

    directory = shutil.copytree(model_dir, tmp_path / "model")
    weights = weights_fingerprint(directory)
    (directory / "model.safetensors").rename(directory / "named.safetensors")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "transformers_weights": "named.safetensors"}))
    assert loading.part_files(directory, "weights") == [directory / "named.safetensors"]
    assert weights_fingerprint(directory) is not None and weights_fingerprint(directory) != weights  # its name


def _empty_shard(directory, name: str) -> None:
    """Shard ``name`` of a sharded model an empty PyTorch file, as its index names it."""
    (directory / f"{name}.safetensors").unlink()
    (directory / f"{name}.bin").write_bytes(b"")
    index = directory / "model.safetensors.index.json"
    index.write_text(index.read_text().replace(f"{name}.safetensors", f"{name}.bin"))


def test_the_shards_of_an_index_a_config_names_are_the_weights(model_dir, tmp_path):
    """Probe 66: ``transformers_weights`` naming an index: the index counted, the shards it names did not."""
    from transformers import AutoModelForCausalLM

    from pretrained import loading

    directory = _sharded(AutoModelForCausalLM.from_pretrained(model_dir).eval(), tmp_path / "model", "w")
    (directory / "model.safetensors.index.json").rename(directory / "w.safetensors.index.json")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "transformers_weights": "w.safetensors.index.json"}))
    assert {path.name for path in loading.part_files(directory, "weights")} == {
        "w.safetensors.index.json", *(path.name for path in directory.glob("w-*.safetensors"))}


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "model.safetensors.index.json").write_text("{"), "model.safetensors.index.json: not a weight "
                                                                      "index"),
    (lambda d: (d / "model.safetensors.index.json").write_text('{"weight_map": 3}'), "not a weight index"),
    (lambda d: [p.unlink() for p in d.glob("part-*")] and (d / "model.safetensors.index.json").unlink()
     or (d / "pytorch_model.bin").write_bytes(b"PK\x03\x04 cut short"), "its weights could not be read"),
    (lambda d: _empty_shard(d, "part-00001"), "part-00001.bin: an empty weight file"),
])
def test_a_damaged_index_or_pytorch_checkpoint_is_one_error(model_dir, tmp_path, damage, message):
    """Probe 64: a raw JSONDecodeError, or PyTorch's "failed finding central directory"."""
    from transformers import AutoModelForCausalLM

    from pretrained import loading

    directory = _sharded(AutoModelForCausalLM.from_pretrained(model_dir).eval(), tmp_path / "model", "part")
    damage(directory)
    with pytest.raises(UsageError, match=re.escape(message)):
        loading.load(directory)


def test_weights_missing_tensors_are_refused(model_dir, tmp_path):
    """Probe 66: transformers filled missing tensors with random values, another model each run, in silence."""
    from safetensors.torch import load_file, save_file

    from pretrained import loading

    directory = shutil.copytree(model_dir, tmp_path / "model")
    tensors = load_file(directory / "model.safetensors")
    dropped = sorted(tensors)[-1]
    save_file({name: t for name, t in tensors.items() if name != dropped}, directory / "model.safetensors",
              metadata={"format": "pt"})
    short = ".".join(dropped.split(".")[-2:])  # named as the model names it, the checkpoint's prefix aside
    with pytest.raises(UsageError, match=f"weight files lack 1 of the tensors its config.json makes "
                                         f"\\(\\S*{re.escape(short)}\\)"):
        loading.load(directory)


def test_the_weights_are_hashed_once_a_state_not_once_a_bind(model_dir, tmp_path, monkeypatch):
    """A press binds on every context it scores: the weights' hash reads their files once as they are, and again
    only when a weight file changes — also where the rewrite keeps its size and modification time."""
    from pathlib import Path

    from presses import calibration

    model = shutil.copytree(model_dir, tmp_path / "model")
    weights = model / "model.safetensors"
    reads = []
    real = Path.read_bytes

    def read_bytes(path):
        reads.append(path)
        return real(path)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    first = calibration.weights_fingerprint(model)
    assert calibration.weights_fingerprint(model) == first and reads.count(weights) == 1
    stamp = weights.stat()
    data = real(weights)
    weights.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    os.utime(weights, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # as `touch -r` would leave it
    assert weights.stat().st_size == stamp.st_size
    assert calibration.weights_fingerprint(model) != first and reads.count(weights) == 2


def test_a_config_that_is_a_pipe_is_refused_not_read(tmp_path):
    """Probe 66: a FIFO config.json hung bench compare."""
    from pretrained import loading

    os.mkfifo(tmp_path / "config.json")
    with pytest.raises(UsageError, match="config.json: not a regular file"):
        loading.read_config(tmp_path)


def test_the_shards_of_an_index_in_a_subfolder_a_config_names_are_the_weights(model_dir, tmp_path, capsys):
    """Probe 67: a ``transformers_weights`` index in a subfolder was looked up by its file name alone, so the shards
    it names (which transformers loads) were left out: other weights resumed a store; without a top-level weight
    file the model was refused as one without weights."""
    from transformers import AutoModelForCausalLM

    from bench.commands.arguments import model_spec
    from pretrained import loading

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    directory = _sharded(model, tmp_path / "model", "w/part")
    (directory / "model.safetensors.index.json").rename(directory / "w" / "my.safetensors.index.json")
    config = json.loads((directory / "config.json").read_text())
    config["transformers_weights"] = "w/my.safetensors.index.json"
    (directory / "config.json").write_text(json.dumps(config))
    shards = sorted((directory / "w").glob("part-*.safetensors"))
    assert len(shards) > 1 and set(loading.part_files(directory, "weights")) == {
        directory / "w" / "my.safetensors.index.json", *shards}
    args = type("Args", (), {"model": str(directory), "device": "cpu", "dtype": "float32", "allow_download": False})
    assert model_spec(args).path == str(directory)
    before = loading.identity(directory).weights
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(1.5)
    theirs = _sharded(model, tmp_path / "theirs", "w/part")
    for shard in shards:  # their shards under our index: what transformers loads changes, so must the fingerprint
        shutil.copy(theirs / "w" / shard.name, shard)
    assert loading.identity(directory).weights != before
    assert torch.equal(loading.load(directory)[0].model.embed_tokens.weight, model.model.embed_tokens.weight)


@pytest.mark.parametrize("make, message", [
    (os.mkfifo, "not a regular file"),
    (os.mkdir, "a folder, where"),
])
def test_a_shard_that_is_a_pipe_or_a_folder_is_named_not_read(model_dir, tmp_path, make, message):
    """Probe 67: a pipe in a shard's place hung the load inside the safetensors library, past SIGTERM; a folder
    there was "No such device (os error 19)", naming nothing."""
    from transformers import AutoModelForCausalLM

    from pretrained import loading

    directory = _sharded(AutoModelForCausalLM.from_pretrained(model_dir).eval(), tmp_path / "model", "part")
    shard = sorted(directory.glob("part-*.safetensors"))[-1]
    shard.unlink()
    make(shard)
    with pytest.raises(UsageError, match=f"{re.escape(str(shard))}: {message}"):
        loading.load(directory)
    with pytest.raises(UsageError, match=re.escape(str(shard))):
        loading.identity(directory)


def test_a_weight_file_that_is_a_pipe_is_refused_not_read(model_dir, tmp_path):
    from pretrained import loading

    directory = shutil.copytree(model_dir, tmp_path / "model")
    (directory / "model.safetensors").unlink()
    os.mkfifo(directory / "model.safetensors")
    with pytest.raises(UsageError, match="model.safetensors: not a regular file"):
        loading.load(directory)


def test_a_peft_adapter_directory_is_refused_in_one_line(model_dir, tmp_path, capsys, no_model_load):
    """Probe 67: with peft installed, transformers loads an adapter's base model from another directory (a raw
    AttributeError in transformers 5.2, and weights the fingerprint does not cover)."""
    directory = shutil.copytree(model_dir, tmp_path / "model")
    (directory / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tmp_path / "base"),
                                                               "peft_type": "LORA"}))
    code, err = run_cli(capsys, "compare", "--model", directory, "--press", "keydiff", "--out", tmp_path / "out")
    assert code == 2 and "a PEFT adapter (adapter_config.json)" in err and "merge_and_unload" in err, err
    assert not (tmp_path / "out").exists()


def test_the_gate_allocation_refuses_a_calibration_of_other_weights(model_dir, tmp_path, capsys):
    """Probe 67: ``--alloc gate`` read the gate weights of a calibration measured on another model, which
    TriAttention refuses."""
    directory = shutil.copytree(model_dir, tmp_path / "model")
    calibration = Calibration.load(directory)
    calibration.weights = "0" * 12
    calibration.save(directory)
    code, err = run_cli(capsys, "compare", "--model", directory, "--press", "keydiff", "--alloc", "gate",
                        "--keep-fractions", "0.5", "--tasks", "niah_single_1", "--length", "300", "--n", "1",
                        "--out", tmp_path / "out")
    assert code == 2 and f"allocator 'gate' cannot run on {directory}: the calibration in {directory} was " \
                         "measured on model weights 000000000000, not this model's" in err, err


DAMAGES = {"truncated": lambda path: path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2]),
           "empty": lambda path: path.write_bytes(b""),
           "not JSON": lambda path: path.write_text("{not json"),
           "JSON of no estimator": lambda path: path.write_text("[1, 2]"),
           # the re-probe of 64: said "no estimator there" and advised training, the file being there as these
           "a folder": lambda path: (path.unlink(), path.mkdir()),
           "a pipe": lambda path: (path.unlink(), os.mkfifo(path)),
           "a link to a device": lambda path: (path.unlink(), path.symlink_to("/dev/zero"))}
"""Damage done to one artifact file (issue 64: tracebacks where the model's own gets one line)."""


@pytest.mark.parametrize("item, folder, file, damage", [
    ("gatesight[estimator={dir}]/flat", "gatesight", "gatesight.safetensors", "truncated"),
    ("gatesight[estimator={dir}]/flat", "gatesight", "gatesight.safetensors", "empty"),
    ("gatesight[estimator={dir}]/flat", "gatesight", "gatesight.json", "not JSON"),
    ("gatesight[estimator={dir}]/flat", "gatesight", "gatesight.json", "JSON of no estimator"),
    ("gatesight[estimator={dir}]/flat", "gatesight", "gatesight.json", "a folder"),
    ("gatesight[estimator={dir}]/flat", "gatesight", "gatesight.safetensors", "a pipe"),
    ("gatesight[estimator={dir}]/flat", "gatesight", "gatesight.json", "a link to a device"),
    ("triattention[calibration={dir}]/flat", ".", "calibration/calibration.safetensors", "a pipe"),
    ("triattention[calibration={dir}]/flat", ".", "calibration/calibration.safetensors", "truncated"),
    ("triattention[calibration={dir}]/flat", ".", "calibration/calibration.safetensors", "empty"),
])
def test_a_damaged_artifact_given_by_path_is_one_line_before_work(model_dir, tmp_path, capsys, no_model_load, item,
                                                                   folder, file, damage):
    """An artifact an option names goes through the checks the model directory's own goes through: one line naming
    the option and the damaged file, exit 2, before the model loads and before --out is made."""
    copy = shutil.copytree(model_dir, tmp_path / "copy")
    DAMAGES[damage](copy / folder / file)
    given = copy / folder if folder != "." else copy
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--methods", item.format(dir=given), "--n", "1",
                        "--tasks", "niah_single_1", "--length", "300", "--out", tmp_path / "out")
    assert code == 2 and "Traceback" not in err, err  # run_cli: the error is one line, the last
    assert f"={str(given)!r}: {copy / folder / file if folder != '.' else copy / file}: " in err, err
    assert not (tmp_path / "out").exists()


def _tensors(path, change):
    """``path``'s safetensors rewritten with its tensors changed by ``change`` (their dict, first key sorted
    first); its metadata kept."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    tensors = load_file(str(path))
    change(tensors, sorted(tensors)[0])
    save_file(tensors, str(path), metadata=meta)


def _settings(path, change):
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))


def _metadata(path, meta):
    from safetensors.torch import load_file, save_file

    save_file(load_file(str(path)), str(path), metadata=meta)


def _nan(tensors, first):
    tensors[first] = tensors[first].clone()
    tensors[first].view(-1)[0] = float("nan")


def _inf(tensors, first):
    tensors[first] = tensors[first].clone()
    tensors[first].view(-1)[-1] = float("inf")


def _huge(tensors, first):
    """The re-probe's damage: every value the largest finite float32 (3.4e38), which overflowed in scoring."""
    tensors[first] = torch.full_like(tensors[first], torch.finfo(torch.float32).max)


def _tiny_std(tensors, first):
    key = next(k for k in sorted(tensors) if k.endswith(".std"))
    tensors[key] = torch.full_like(tensors[key], 1e-30)


ESTIMATOR_DAMAGE = {  # the probe's recipes (/tmp/probe-w/ed/make.py), on the tiny model's estimator
    "a layer the model lacks": (
        lambda d: _settings(d / "gatesight.json", lambda c: c.update(gdn_layers={"99": [0, 1]})),
        "its gatesight.json names layers [99]"),
    "a NaN": (lambda d: _tensors(d / "gatesight.safetensors", _nan), "holds NaN or infinite values"),
    "a huge finite value": (lambda d: _tensors(d / "gatesight.safetensors", _huge), "of magnitude 3.4e+38, past 1e+06"),
    "a standard deviation near 0": (lambda d: _tensors(d / "gatesight.safetensors", _tiny_std),
                                    ".std holds a value below 1e-06"),
    "a tensor of another shape": (lambda d: _tensors(d / "gatesight.safetensors",
                                                     lambda t, first: t.update({first: torch.zeros(3, 3)})),
                                  "expected ["),
    "a missing tensor": (lambda d: _tensors(d / "gatesight.safetensors", lambda t, first: t.pop(first)),
                         "has no tensor"),
    "a negative window": (lambda d: _settings(d / "gatesight.json", lambda c: c.update(window=-3)),
                          "window=-3, expected an integer >= 1"),
    # probe 8: accepted, and scored with ΔNLL 23 nats where the intact estimator gives 0.001
    "a repeated signal layer": (
        lambda d: _settings(d / "gatesight.json", lambda c: c.update(
            gdn_layers={k: [v[0]] * len(v) for k, v in c["gdn_layers"].items()})),
        "expected a list of at most window=6 distinct GDN layer indices"),
    # probe 9: accepted, ΔNLL 0.064 where the intact estimator gives 0.0013 (the features in another order)
    "signal layers out of depth order": (
        lambda d: _settings(d / "gatesight.json", lambda c: c.update(
            gdn_layers={k: v[::-1] for k, v in c["gdn_layers"].items()})),
        "window=6 distinct GDN layer indices >= 0 in depth order (ascending)"),
    "signal layers the model lacks": (
        lambda d: _settings(d / "gatesight.json", lambda c: c.update(
            gdn_layers={k: [7] for k in c["gdn_layers"]})), "which this model does not have before it"),
}
CALIBRATION_DAMAGE = {
    "a NaN": (lambda f: _tensors(f, _nan), "holds NaN or infinite values"),
    "an infinity": (lambda f: _tensors(f, _inf), "holds NaN or infinite values"),
    "a huge finite value": (lambda f: _tensors(f, _huge), "of magnitude 3.4e+38, past 1e+06"),
    "zeros everywhere": (lambda f: _tensors(f, lambda t, _: t.update({k: torch.zeros_like(v) for k, v in t.items()})),
                         "is 0 everywhere, which no measured calibration is"),
    "integers": (lambda f: _tensors(f, lambda t, first: t.update({first: t[first].long()})),
                 "is of int64, not of real"),
    "a tensor of another shape": (lambda f: _tensors(f, lambda t, first: t.update({first: torch.zeros(2, 5)})),
                                  "expected one shape [heads, bands]"),
    "a tensor of another model's shape": (
        lambda f: _tensors(f, lambda t, first: t.update({k: torch.ones(2, 5) for k in t if k.endswith(".3")})),
        "this model's are [4, 4]"),
    "a missing tensor": (lambda f: _tensors(f, lambda t, first: t.pop(first)), "has no tensor"),
    "gate weights not JSON": (lambda f: _metadata(f, {"gate_weights": "{oops", "tokens": "5", "sources": "[]"}),
                              "its metadata gate_weights is not JSON"),
    "no metadata": (lambda f: _metadata(f, None), "holds no metadata"),
}


@pytest.mark.parametrize("given", ["option", "model"])
@pytest.mark.parametrize("damage", [*(f"estimator: {k}" for k in ESTIMATOR_DAMAGE),
                                    *(f"calibration: {k}" for k in CALIBRATION_DAMAGE)])
def test_an_artifact_whose_contents_are_wrong_is_one_line_naming_its_file(model_dir, tmp_path, capsys, given,
                                                                         damage):
    """Probe 64: an estimator or calibration that reads whole but holds a layer the model lacks, a NaN, a tensor of
    another shape or none, metadata that is no JSON or none, failed deep in scoring (KeyError, ValueError,
    RuntimeError tracebacks) or — a negative window — not at all. Their loaders check what they hold, and the press
    checks it against the model before any context is scored: one line naming the file, by an option's path or in
    the model's own directory."""
    kind, case = damage.split(": ")
    model = shutil.copytree(model_dir, tmp_path / "model")
    if kind == "estimator":
        folder, method, option = model / "gatesight", "gatesight", "estimator"
        make, says = ESTIMATOR_DAMAGE[case]
        make(folder)
        named = folder / ("gatesight.json" if "window" in says else "gatesight.safetensors")
    else:
        folder, method, option = model, "triattention", "calibration"
        make, says = CALIBRATION_DAMAGE[case]
        named = model / "calibration" / "calibration.safetensors"
        make(named)
    if given == "option":
        artifact = shutil.copytree(folder, tmp_path / "artifact")
        shutil.rmtree(model / ("gatesight" if kind == "estimator" else "calibration"))
        named = artifact / named.relative_to(folder)
        methods = f"{method}[{option}={artifact}]/flat"
    else:
        methods = f"{method}/flat"
    code, err = run_cli(capsys, "compare", "--model", model, "--methods", methods, "--tasks", "niah_single_1",
                        "--n", "1", "--length", "300", "--out", tmp_path / "out")
    assert code == 2 and f"{named}" in err and says in err, err
    assert "Traceback" not in err and not (tmp_path / "out" / "results.jsonl").exists()


def test_an_estimator_saved_in_half_precision_scores_as_in_single(model_dir, tmp_path, capsys):
    """The re-probe of 64: one tensor of an estimator stored as float16 failed in scoring (a matrix product of float
    and half) after the model loaded; its loader reads every tensor in float32, as it is scored."""
    from presses.gatesight import GateSightEstimator

    estimator = shutil.copytree(model_dir / "gatesight", tmp_path / "estimator")
    _tensors(estimator / "gatesight.safetensors", lambda t, first: t.update({k: v.half() for k, v in t.items()}))
    loaded = GateSightEstimator.load(estimator)
    assert all(t.dtype == torch.float32 for layer in loaded.layers.values() for t in layer.values())
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--methods", f"gatesight[estimator={estimator}]/flat",
                        "--tasks", "niah_single_1", "--n", "1", "--length", "300", "--keep-fractions", "0.5", "--out",
                        tmp_path / "out")
    assert code == 0, err


@pytest.mark.parametrize("option", ["estimator", "calibration"])
def test_an_artifact_path_that_is_a_file_is_named_a_file(model_dir, tmp_path, capsys, option):
    """The re-probe of 64: ``estimator=FILE`` said "no such directory" of a path that exists."""
    press = "gatesight" if option == "estimator" else "triattention"
    given = model_dir / "config.json"
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--methods", f"{press}[{option}={given}]/flat",
                        "--n", "1", "--out", tmp_path / "out")
    assert code == 2 and f"{option}={str(given)!r}: a file, not a directory" in err, err


@pytest.mark.parametrize("option", ["estimator", "calibration"])
def test_an_artifact_path_that_is_a_link_is_named_with_where_it_leads(model_dir, tmp_path, option):
    """Probe 9 (row 14d): ``estimator=LINK`` with LINK a link to /dev/null said "a file, not a directory", and one
    that leads nowhere "no such directory": the link is named with its target."""
    press = GateSightPress if option == "estimator" else TriAttentionPress
    for target, said in (("/dev/null", "a link to /dev/null, not a directory"),
                         (tmp_path / "gone", f"a link to {tmp_path / 'gone'}, which does not exist")):
        link = tmp_path / "link"
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        with pytest.raises(UsageError, match=f"^{re.escape(f'{option}={str(link)!r}: {said} (give the ')}"):
            press(**{option: str(link)})


def test_an_estimators_file_that_is_a_link_leading_nowhere_is_named_so(model_dir, tmp_path):
    """Probe 9 (row 14d): an estimator folder whose gatesight.safetensors is a link to a file that is gone said "no
    gatesight.safetensors", of a name the folder shows."""
    copy = shutil.copytree(model_dir / "gatesight", tmp_path / "estimator")
    (copy / "gatesight.safetensors").unlink()
    (copy / "gatesight.safetensors").symlink_to(tmp_path / "gone.safetensors")
    with pytest.raises(UsageError, match="^" + re.escape(
            f"estimator={str(copy)!r}: no GateSight estimator there (gatesight.safetensors is a link to "
            f"{tmp_path / 'gone.safetensors'}, which does not exist); train one with")):
        GateSightPress(estimator=str(copy))

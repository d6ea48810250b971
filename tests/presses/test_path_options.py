"""What the CLI hands a press as text: an artifact's directory (``gatesight[estimator=DIR]``,
``triattention[calibration=DIR]``) is loaded from there, or refused naming the directory before any model loads;
bracket options given to the library, a kept fraction given as text and a context longer than the model's positions
are each one error saying what to do instead."""

import pytest
import torch

import presses
from bench.cost import run_cost
from presses.calibration import Calibration
from presses.gatesight import GateSightEstimator, GateSightPress
from presses.triattention import TriAttentionPress
from runtime import prefill
from runtime.errors import UsageError
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


@pytest.mark.parametrize("item", ["triattention[calibration={dir}]", "gatesight[estimator={dir}]"])
def test_the_cli_refuses_a_missing_artifact_directory_before_the_model_loads(model_dir, tmp_path, capsys,
                                                                            no_model_load, item):
    missing = tmp_path / "nowhere"
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--press", item.format(dir=missing), "--alloc",
                        "flat", "--out", tmp_path / "out")
    assert code == 2 and f"={str(missing)!r}: no such directory" in err, err


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

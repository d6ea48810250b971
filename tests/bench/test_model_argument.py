"""A ``--model`` that is no directory, no catalogued name and no hub id is refused naming the catalogued names close
to it, never sent to the hub (probe 14, U3: ``smollm2-135m-hybrid/`` read as a failed download)."""

import huggingface_hub
import pytest

from pretrained import loading
from pretrained.model_spec import is_hub_id
from runtime.errors import MissingFileError, UsageError
from tests.helpers import run_cli


@pytest.fixture
def no_hub(monkeypatch, tmp_path):
    def fetch(*args, **kwargs):
        raise AssertionError("sent to the hub")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fetch)
    monkeypatch.chdir(tmp_path)  # no folder of that name here


def test_a_catalogued_name_with_a_slash_is_named_not_fetched(no_hub, capsys, tmp_path):
    code, err = run_cli(capsys, "compare", "--model", "smollm2-135m-hybrid/", "--tasks", "niah_single_1", "--n", "1",
                        "--out", tmp_path / "out")
    assert code == 2 and err.startswith(
        "bench compare: error: no model at --model 'smollm2-135m-hybrid/': no such directory, and no catalogued "
        "model of that name (did you mean smollm2-135m-hybrid"), err
    assert "hub:" not in err and not (tmp_path / "out").exists()


def test_the_library_names_it_too(no_hub):
    with pytest.raises(MissingFileError, match=r"no model at smollm2-135m-hybrid/: expected a local HF model "
                                               r"directory \(with config.json\), a catalogued model's name \(did you "
                                               r"mean smollm2-135m-hybrid"):
        loading.resolve("smollm2-135m-hybrid/")


@pytest.mark.parametrize(("text", "hub"), [("Qwen/Qwen3.5-0.8B", True), ("owner/name", True), ("name/", False),
                                           ("/name", False), ("a/b/c", False), ("./a", False), ("~/a", False),
                                           ("name", False)])
def test_a_hub_id_is_owner_slash_name(text, hub):
    assert is_hub_id(text) is hub


HUB_ID = ("a hub id is owner/name, each part of ASCII letters, digits, '-', '_' and '.', at most 96 characters, "
          "starting and ending with a letter, digit or '_', without '--' or '..', and not ending in '.git'")


@pytest.mark.parametrize("text", ["a/b c", "a/..", "a/-b", "a/b?c", "Qwen/Qwen3.5 0.8B"])
def test_an_id_the_hub_would_refuse_is_named_not_fetched(no_hub, capsys, tmp_path, text):
    """Probe 15, U3: such ids read as a failed download ("could not fetch a/b c from the Hugging Face hub")."""
    code, err = run_cli(capsys, "compare", "--model", text, "--tasks", "niah_single_1", "--n", "1",
                        "--out", tmp_path / "out")
    assert code == 2 and err == (f"bench compare: error: no model at {text!r}: no local directory, and no id the "
                                 f"Hugging Face hub takes: {HUB_ID}"), err
    with pytest.raises(UsageError, match=r"^no model at .*: no local directory, and no id the Hugging Face hub takes"):
        loading.resolve(text)

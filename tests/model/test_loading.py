"""Model loading: local directories, hub ids from the local cache only (offline), device and dtype."""

import re
import reprlib
import shutil

import huggingface_hub.constants
import pytest
import torch

from bench.commands.cli import main
from bench.run.plan import plan
from pretrained import loading
from pretrained.loading import ModelSpec
from runtime.errors import UsageError
from tests.helpers import FAMILIES, compare_settings, copy_model, run_cli

REMOVED = object()
"""A value of :func:`_edited_config`'s ``change`` that removes its key (None writes a JSON null)."""


def _fake_cache(tmp_path, model_dir, repo="someorg/tiny-hybrid"):
    """A Hugging Face hub cache holding ``model_dir`` as ``repo`` (the layout snapshot_download reads)."""
    root = tmp_path / "hub" / ("models--" + repo.replace("/", "--"))
    commit = "0" * 40
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    shutil.copytree(model_dir, root / "snapshots" / commit)
    return tmp_path / "hub"


def test_hub_id_is_found_in_the_local_cache(model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(_fake_cache(tmp_path, model_dir)))
    directory = loading.resolve("someorg/tiny-hybrid")
    assert (directory / "config.json").exists() and "snapshots" in str(directory)
    model, _, _ = loading.load(ModelSpec("someorg/tiny-hybrid", dtype="bfloat16"))
    assert next(model.parameters()).dtype == torch.bfloat16


def test_a_missing_hub_id_names_both_places_and_downloads_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match=r"no model at nobody/none: it is not a local directory, and the hub "
                                                r"id is not in the local Hugging Face cache \(.*empty\)"
                                                r".*--allow-download"):
        loading.resolve("nobody/none")
    with pytest.raises(FileNotFoundError, match="expected a local HF model directory"):
        loading.resolve(str(tmp_path / "no" / "such" / "dir"))


@pytest.mark.parametrize("spec, message", [
    (dict(device="tpu"), "unknown device 'tpu'; choose cpu, cuda, cuda:N or auto"),
    (dict(dtype="float8"), "unknown dtype 'float8'; choose auto, float32, bfloat16, float16"),
])
def test_bad_device_or_dtype(spec, message):
    with pytest.raises(ValueError, match=message):
        ModelSpec(**spec)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_cuda_without_cuda_stops_before_loading(model_dir, tmp_path, capsys):
    assert main(["compare", "--model", str(model_dir), "--device", "cuda", "--out", str(tmp_path)]) == 2
    assert "torch sees no CUDA device" in capsys.readouterr().err


def test_dtype_auto_keeps_the_checkpoints_dtype(model_dir):
    model, _, _ = loading.load(ModelSpec(str(model_dir), dtype="auto"))
    assert next(model.parameters()).dtype == torch.float32  # the tiny model was saved in float32


def test_a_model_name_too_long_for_a_folder_of_results_is_refused_before_work(model_dir, tmp_path, capsys,
                                                                              no_model_load):
    """Probe 9: a model folder named in 250 characters ran, and ``bench publish`` then failed with the file system's
    "File name too long" (a group's folder is named after the model). The name is bounded where a model is resolved,
    for every command: one line naming it, its length and the limit."""
    from pretrained.model_spec import MODEL_NAME_MAX

    longest = tmp_path / ("m" * MODEL_NAME_MAX)
    longest.symlink_to(model_dir)
    assert loading.resolve(str(longest)) == longest
    longer = tmp_path / ("m" * 250)
    longer.symlink_to(model_dir)
    said = (f"model {reprlib.repr('m' * 250)} in {tmp_path}: its name (its folder's, which its rows carry) is 250 "
            f"characters, and a model's name is at most {MODEL_NAME_MAX}, so that its results' folders can be named "
            "after it; give the model a folder of a shorter name (a link to it of a shorter name will do)")
    for command in (["compare", "--out", tmp_path / "out"],
                    ["model-eval", "--tasks", "niah_single_1", "--lengths", "300", "--n", "1", "--rows",
                     tmp_path / "out"]):
        code, err = run_cli(capsys, *command, "--model", longer)
        assert code == 2 and err.endswith(said), err
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name, unseen", [
    ("x\n## injected", "the character '\\n' (U+000A) at 1"),
    ("hybrid-byte-12l\u200b", "the character '\\u200b' (U+200B) at 15"),
    ("a\u202eb", "the character '\\u202e' (U+202E) at 1"),
    ("a\u00a0b", "the character '\\xa0' (U+00A0) at 1"),
    ("hybrid-byte-12l ", "whitespace at its start or end"),
    ("\tm", "whitespace at its start or end"),
    *[(f"hybrid-byte-12l{char}", f"the character {char!r} (U+{ord(char):04X}) at 15") for char in (
        "\u3164", "\u115f", "\u1160", "\uffa0", "\u2800", "\u034f", "\ufe00", "\ufe0f", "\U000e0100",
        "\U000e01ef", "\u0301", "\u20dd")],
])
def test_a_model_name_a_report_would_not_show_as_it_is_is_refused_before_work(model_dir, tmp_path, capsys,
                                                                              no_model_load, name, unseen):
    """Probe 10: a folder named ``x<newline>## injected`` gave summary.md and leaderboard.md a heading of its own, and
    ``hybrid-byte-12l `` or ``hybrid-byte-12l<zero-width space>`` ran under a heading that reads as the default
    model's; so did one ending in a Hangul filler or a combining mark (probe 11). Refused where the name is bounded,
    naming it as Python writes it."""
    _assert_name_refused(model_dir, tmp_path, capsys, name, f"holds {unseen}; a model's name is visible characters, "
                         "spaces only between them, so that reports show it as it is; give the model a folder of such "
                         "a name (a link to it will do)")


def _assert_name_refused(model_dir, tmp_path, capsys, name: str, why: str) -> None:
    """``compare --model`` a link named ``name`` to the model is refused before work, its name followed by ``why``."""
    link = tmp_path / name
    link.symlink_to(model_dir)
    code, err = run_cli(capsys, "compare", "--out", tmp_path / "out", "--model", link)
    assert code == 2 and err.endswith(f"model {name!r} in {tmp_path}: its name (its folder's, which its rows and "
                                      f"reports carry) {why}"), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name, lookalike", [
    ("\u04bbybrid-byte-12l", "mixes scripts: '\u04bb' (U+04BB CYRILLIC SMALL LETTER SHHA), of the CYRILLIC script, "
                             "among LATIN characters"),
    ("hybrid-byte-12\u0399", "mixes scripts: '\u0399' (U+0399 GREEK CAPITAL LETTER IOTA), of the GREEK script, "
                             "among LATIN characters"),
    ("\uff48ybrid", "holds '\uff48' (U+FF48 FULLWIDTH LATIN SMALL LETTER H), a compatibility form of 'h'"),
    ("hybrid-byte-1\uff12l", "holds '\uff12' (U+FF12 FULLWIDTH DIGIT TWO), a compatibility form of '2'"),
    ("hybrid-byte-\u0661" "2l", "mixes scripts: '\u0661' (U+0661 ARABIC-INDIC DIGIT ONE), of the ARABIC script, "
                               "among LATIN characters"),
    ("\u6a21\u578b\u3105\u30a2", "mixes scripts: '\u3105' (U+3105 BOPOMOFO LETTER B), of the BOPOMOFO script, "
                                 "among HAN characters"),
    ("hybrid\u2010byte\u201012l", "holds '\u2010' (U+2010 HYPHEN), a character outside ASCII that is no letter or "
                                  "digit"),
    ("hybrid\u2024byte", "holds '\u2024' (U+2024 ONE DOT LEADER), a compatibility form of '.'"),
])
def test_a_model_name_that_could_pass_for_another_is_refused_before_work(model_dir, tmp_path, capsys, no_model_load,
                                                                         name, lookalike):
    """Probe 12: a Cyrillic ``һ`` among Latin letters, U+2010 hyphens or a fullwidth ``２`` ran under a heading that
    reads as the default model's. A name holds letters and digits of one script (or of the scripts Japanese, Chinese
    or Korean are written in), no compatibility form of another character, and outside ASCII no punctuation or
    symbol."""
    _assert_name_refused(model_dir, tmp_path, capsys, name, f"{lookalike}, so that it reads as another model's name "
                         "does; give the model a folder of a name in one script, its punctuation ASCII (a link to it "
                         "will do)")


@pytest.mark.parametrize("name, known, stands", [
    ("hybr\u0131d-byte-12l", "hybrid-byte-12l", "'\u0131' (U+0131 LATIN SMALL LETTER DOTLESS I) for 'i'"),
    ("hybrid-byte-12\u01c0", "hybrid-byte-12l", "'\u01c0' (U+01C0 LATIN LETTER DENTAL CLICK) for 'l'"),
    ("sm\u00f6llm2-135m-instruct", "smollm2-135m-instruct", "'\u00f6' (U+00F6 LATIN SMALL LETTER O WITH DIAERESIS) for "
                                                         "'o'"),
])
def test_a_model_name_that_reads_as_a_known_models_is_refused_before_work(model_dir, tmp_path, capsys,
                                                                          no_model_load, name, known, stands):
    """Probe 13: ``hybrıd-byte-12l`` (a dotless i) and ``hybrid-byte-12ǀ`` (a dental click) are Latin letters of one
    script, and ran under a heading that reads as the default model's. A name that reads as a catalogued or the
    default model's, each non-ASCII letter read as the ASCII one it stands for, is refused unless it is that name."""
    _assert_name_refused(model_dir, tmp_path, capsys, name, f"reads as the model {known!r} (its {stands}) but is "
                         "another name, so that its rows would read as that model's; give the model a folder of a "
                         "name of its own (a link to it will do)")


@pytest.mark.parametrize("name", ["my model", "éü", "模型-1", "модель-1", "Qwen3.5-0.8B",
                                  "\u0646\u0645\u0648\u0630\u062c-\u0661", "日本語モデル", "東京ガス-7b",
                                  "qwen-日本語", "한국어-모델", "模型ㄅ", "hybrid-byte-121",
                                  "Hybrid-Byte-12L", "mödel"])
def test_a_model_name_of_visible_characters_is_taken(model_dir, tmp_path, name):
    link = tmp_path / name
    link.symlink_to(model_dir)
    assert loading.resolve(str(link)) == link


def test_a_tokenizer_file_that_is_json_but_no_object_is_named_before_loading(model_dir, tmp_path, capsys,
                                                                            no_model_load):
    """Probe 9 (beside its deep tokenizer files): a tokenizer.json holding a JSON array ended in transformers'
    ``TypeError``. Named in one line before the model loads."""
    copy = copy_model(model_dir, tmp_path)
    (copy / "tokenizer.json").write_text("[1]")
    code, err = run_cli(capsys, "compare", "--model", copy, "--out", tmp_path / "out")
    assert code == 2 and err.endswith(f"{copy / 'tokenizer.json'}: no JSON object (list at the top), where "
                                      "transformers reads one; copy it again from where the model came from"), err


def test_a_tokenizer_only_loading_finds_damaged_is_one_line(model_dir, tmp_path):
    """A tokenizer.json that parses but is no tokenizer: transformers' ``KeyError`` (and the Rust tokenizers' bare
    ``Exception`` for what its own parser refuses) ended the load in a traceback. One line naming the folder."""
    copy = copy_model(model_dir, tmp_path)
    deep = (copy / "tokenizer.json").read_text().strip()[:-1] + ', "extra": ' + "[" * 200 + "]" * 200 + "}"
    for text, error in (('{"version": "1.0"}', "KeyError: 'added_tokens'"), (deep, "Exception: ")):
        (copy / "tokenizer.json").write_text(text)
        with pytest.raises(UsageError, match=f"^{re.escape(f'{copy}: its tokenizer could not be loaded ({error}')}.*; "
                                             "copy the tokenizer's files again from where the model came from$"):
            loading.load(copy)


@pytest.mark.parametrize("family", FAMILIES)
def test_perlayer_takes_one_weight_per_attention_layer_of_every_family(tiny, family, tmp_path):
    """The attention layers counted from the config alone, before the model loads, are those transformers builds an
    attention module for (Bamba's ``attn_layer_indices``, Granite-4.0-H's ``"mamba"`` layer types, Falcon-H1's
    parallel layers): ``--alloc perlayer`` with one weight per attention layer passes, with one more is refused."""
    model = tiny(family)
    model.config.save_pretrained(tmp_path)
    attention = sum(getattr(layer, "self_attn", None) is not None for layer in model.model.layers)
    assert loading.attention_layer_count(tmp_path) == attention
    weights = [1.0 + k for k in range(attention)]
    plan(compare_settings(tmp_path, tmp_path / "out", allocators=["perlayer"], alloc_options={"weights": weights}))
    with pytest.raises(ValueError, match=f"perlayer has {attention + 1} weights; the model has {attention} attention "
                                         "layers"):
        plan(compare_settings(tmp_path, tmp_path / "out", allocators=["perlayer"],
                                  alloc_options={"weights": [*weights, 1.0]}))


@pytest.mark.parametrize("change, says", [
    ({"num_hidden_layers": 5}, "ValueError: `num_hidden_layers` (5) must be equal to the number of layer types (4)"),
    ({"layer_types": ["x"] * 4}, "ValueError: The `layer_types` entries must be in"),
    ({"model_type": REMOVED}, "ValueError: Unrecognized model in"),
    ({"head_dim": 0}, "ZeroDivisionError: "),
    # probe 26, #2: raised as the model is built, or in the bench's own first prefill
    ({"hidden_act": "nope"}, "KeyError: 'nope'"), ({"rope_parameters": [1, 2]}, "AttributeError: "),
    ({"vocab_size": 100, "pad_token_id": 200}, "AssertionError: "),
])
def test_a_config_transformers_builds_no_model_from_is_one_line(model_dir, tmp_path, capsys, change, says):
    """Probe 25, #3: a model folder without files.json (a user's own) whose config.json was edited by hand ended the
    run in transformers' traceback; its refusal is one line naming config.json, and nothing is written."""
    copy = _edited_config(model_dir, tmp_path, change)
    code, err = run_cli(capsys, "compare", "--model", copy, "--press", "snapkv", "--keep-fractions", "0.5", "--n", "1",
                        "--tasks", "niah_single_1", "--length", "300", "--out", tmp_path / "out")
    assert code == 2 and err.startswith(f"bench compare: error: {copy / 'config.json'}: its settings make no model "
                                        "transformers can build (") and says in err, err
    assert "\n" not in err.strip() and "copy it again from where the model came from" in err
    assert not (tmp_path / "out").exists()



@pytest.mark.parametrize("change, says", [
    ({"rms_norm_eps": "x"}, "rms_norm_eps='x': expected a number above 0;"),
    ({"rms_norm_eps": -1}, "rms_norm_eps=-1: expected a number above 0;"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 0.0, "partial_rotary_factor": 0.5}},
     "rope_theta=0.0: expected a number above 0;"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 2.0}},
     "partial_rotary_factor=2.0: expected a number above 0 and at most 1;"),
    # probe 27, #2: a null overrides transformers' default; the rotary split and the position limit were unchecked
    ({"rms_norm_eps": None}, "rms_norm_eps=None: expected a number above 0;"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": None}}, "rope_theta=None: expected a number above 0;"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": "x"}},
     "mrope_section='x': expected a list of three integers >= 0"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [1, -1, 0]}},
     "mrope_section=[1, -1, 0]: expected a list of three integers >= 0"),
    ({"max_position_embeddings": "x"}, "max_position_embeddings='x': expected an integer >= 1;"),
    ({"max_position_embeddings": 0}, "max_position_embeddings=0: expected an integer >= 1;"),
])
def test_a_config_setting_the_bench_forward_reads_is_checked(model_dir, tmp_path, capsys, change, says):
    """Probe 26, #2 and U1: settings transformers takes unchecked failed in the first prefill (a traceback) or gave
    NaN keys, blamed on the weights; each is one line naming config.json, before the model loads."""
    copy = _edited_config(model_dir, tmp_path, change)
    code, err = run_cli(capsys, "compare", "--model", copy, "--press", "snapkv", "--keep-fractions", "0.5", "--n", "1",
                        "--tasks", "niah_single_1", "--length", "300", "--out", tmp_path / "out")
    assert code == 2 and err.startswith(f"bench compare: error: {copy / 'config.json'}: {says}"), err
    assert not (tmp_path / "out").exists()


def test_a_config_that_does_not_fit_the_weights_names_the_tensor(model_dir, tmp_path, capsys):
    """Probe 26, U1: transformers' error pointed at a report its logging hides, and the line blamed the weights."""
    copy = _edited_config(model_dir, tmp_path, {"num_key_value_heads": 4})
    code, err = run_cli(capsys, "compare", "--model", copy, "--press", "snapkv", "--keep-fractions", "0.5", "--n", "1",
                        "--tasks", "niah_single_1", "--length", "300", "--out", tmp_path / "out")
    assert code == 2 and re.search(r"its config\.json does not fit its weights \(model\.layers\.\d+\.self_attn\.[kv]_"
                                   r"proj\.weight is \[16, 32\] in the weight files, \[32, 32\] as config\.json makes "
                                   r"it\); one of them changed since the model was made", err), err


def test_a_config_too_large_to_build_names_config_json(model_dir, tmp_path, capsys):
    """Probe 27, U2: sizes no machine holds (an edited ``vocab_size``) were "weights that could not be read"."""
    copy = _edited_config(model_dir, tmp_path, {"vocab_size": 10**12})
    code, err = run_cli(capsys, "compare", "--model", copy, "--press", "snapkv", "--keep-fractions", "0.5", "--n", "1",
                        "--tasks", "niah_single_1", "--length", "300", "--out", tmp_path / "out")
    assert code == 2 and err.startswith(f"bench compare: error: {copy}: its config.json makes a model larger than this "
                                        "machine can hold ("), err
    assert not (tmp_path / "out").exists()


def test_a_model_whose_full_cache_gives_nan_is_named_not_the_bench(model_dir, tmp_path, capsys):
    """Probe 27, #3: NaN weights in output rows the context never reads (no files.json to hold them to) made the
    no-prune row's NLL NaN, and the run ended blaming "a bug of the bench"; the model is named, with its config.json
    as the other suspect, and nothing is written."""
    copy = _nan_output_row(model_dir, tmp_path)
    code, err = run_cli(capsys, "compare", "--model", copy, "--press", "snapkv", "--keep-fractions", "0.5", "--n", "1",
                        "--tasks", "niah_single_1", "--length", "300", "--out", tmp_path / "out")
    assert code == 2 and err.startswith(f"bench compare: error: the model {copy.name} ({copy}) gives NaN or infinite "
                                        "log-probabilities on its own full cache (answer_nll=nan on niah_single_1 "
                                        "item 0), before any press: its weights are damaged or its config.json was "
                                        "edited: check its files against where they came from"), err
    assert "bug of the bench" not in err and "\n" not in err.strip()
    assert not list((tmp_path / "out").glob("results*"))


def test_model_eval_of_a_model_whose_logits_are_nan_names_the_model(model_dir, tmp_path, capsys):
    """Probe 28, #2: ``model-eval`` of the same model printed accuracy 0 and "bits per byte nan" as measurements,
    ended 0 and wrote score-0 rows; it names the model as compare does, and writes no rows."""
    copy = _nan_output_row(model_dir, tmp_path)
    code, err = run_cli(capsys, "model-eval", "--model", copy, "--tasks", "niah_single_1", "--lengths", "300", "--n",
                        "1", "--rows", tmp_path / "rows.jsonl")
    assert code == 2 and err.startswith(f"bench model-eval: error: the model {copy.name} ({copy}) gives NaN or "
                                        "infinite bits per byte on the held-out "), err
    assert "its weights are damaged or its config.json was edited" in err
    assert not (tmp_path / "rows.jsonl").exists()


def test_model_eval_of_a_model_whose_nan_comes_with_the_question_names_the_model(model_dir, tmp_path, capsys):
    """Probe 29, #1: an untied model whose embedding row of the end-of-turn token (in every question's prompt, in no
    context nor held-out text) is NaN answered garbage, scored 0 as a weak model, exit 0; it is named, no rows."""
    from safetensors.torch import load_file, save_file

    copy = _edited_config(model_dir, tmp_path, {"tie_word_embeddings": False})
    weights = load_file(copy / "model.safetensors")
    (name,) = [key for key in weights if key.endswith("embed_tokens.weight")]
    weights["lm_head.weight"] = weights[name].clone()  # the same model, untied
    weights[name][257] = float("nan")
    save_file(weights, copy / "model.safetensors", metadata={"format": "pt"})
    code, err = run_cli(capsys, "model-eval", "--model", copy, "--tasks", "niah_single_1", "--lengths", "300", "--n",
                        "1", "--rows", tmp_path / "rows.jsonl")
    assert code == 2 and err.startswith(f"bench model-eval: error: the model {copy.name} ({copy}) gives NaN or "
                                        "infinite logits while answering niah_single_1 item 0, before any press"), err
    assert not (tmp_path / "rows.jsonl").exists()


def test_model_eval_refused_after_a_task_puts_the_replaced_rows_back(model_dir, tmp_path, capsys, monkeypatch):
    """Probe 30, U2: a model refused as damaged in a later task left no rows (right) but ``--replace``'s earlier rows
    only in a backup the error line did not name; they are put back, and the line says so."""
    import bench.run.model_eval as model_eval

    rows = tmp_path / "rows.jsonl"
    assert run_cli(capsys, "model-eval", "--model", model_dir, "--tasks", "niah_single_1", "--lengths", "300",
                   "--n", "1", "--rows", rows)[0] == 0
    kept = rows.read_bytes()
    checked = model_eval._check_finite

    def damaged_in_the_second_task(logits, when, parent, directory):
        if "niah_single_2" in when:  # as a NaN that only this task's tokens reach
            raise model_eval._DamagedModel(f"the model gives NaN or infinite logits {when}")
        checked(logits, when, parent, directory)

    monkeypatch.setattr(model_eval, "_check_finite", damaged_in_the_second_task)
    code, err = run_cli(capsys, "model-eval", "--model", model_dir, "--tasks", "niah_single_1,niah_single_2",
                        "--lengths", "300", "--n", "1", "--rows", rows, "--replace")
    assert code == 2 and err.rstrip().endswith(f"after its own prefill of niah_single_2 item 0; the rows this run "
                                               f"wrote to {rows} were removed, the previous ones put back"), err
    assert rows.read_bytes() == kept and not list(tmp_path.glob("rows.jsonl.backup-*"))


def _nan_output_row(model_dir, tmp_path):
    """A copy of ``model_dir`` without files.json whose output row for a token no context holds is NaN (the
    embeddings are tied: its prefill's keys and values stay finite, every log-softmax does not)."""
    from safetensors.torch import load_file, save_file

    copy = _edited_config(model_dir, tmp_path, {})
    weights = load_file(copy / "model.safetensors")
    (name,) = [key for key in weights if key.endswith("embed_tokens.weight")]
    weights[name][259] = float("nan")
    save_file(weights, copy / "model.safetensors", metadata={"format": "pt"})
    return copy


def _edited_config(model_dir, tmp_path, change: dict):
    """A copy of ``model_dir`` without files.json (a user's own model), its config.json updated by ``change``."""
    import json

    copy = copy_model(model_dir, tmp_path)
    (copy / "files.json").unlink(missing_ok=True)
    config = json.loads((copy / "config.json").read_text())
    config.update(change)
    (copy / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not REMOVED}))
    return copy

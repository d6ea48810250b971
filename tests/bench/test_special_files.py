"""A pipe, a socket or a folder where the bench reads or rebuilds a file: named in one line before it is read (probes
67 and 68: a pipe hung compare, label, train or verify — inside a native reader past SIGTERM — and a folder was an
unnamed "No such device")."""

import json
import os
import shutil
import socket
from pathlib import Path

import pytest

from runtime.errors import UsageError, check_regular_file
from tests.helpers import copy_model, run_cli

SMALL_RUN = ["--keep-fractions", "0.5", "--tasks", "niah_single_1", "--length", "300", "--n", "1"]


def _socket(path) -> None:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()


MAKERS = {"pipe": os.mkfifo, "socket": _socket, "folder": os.mkdir}


@pytest.mark.parametrize("kind", MAKERS)
def test_the_check_names_what_is_there_and_passes_a_file_or_nothing(tmp_path, kind):
    MAKERS[kind](tmp_path / "x")
    shown = "a folder" if kind == "folder" else "not a regular file"
    with pytest.raises(UsageError, match=f"x: {shown}, where a thing belongs; move it away"):
        check_regular_file(tmp_path / "x", "a thing")
    (tmp_path / "y").write_text("")
    check_regular_file(tmp_path / "y", "a thing")
    check_regular_file(tmp_path / "z", "a thing")


@pytest.mark.parametrize("kind", ["pipe", "folder"])
@pytest.mark.parametrize("file, method", [
    ("calibration/calibration.safetensors", ["--press", "triattention"]),
    ("calibration/calibration.safetensors", ["--press", "keydiff", "--alloc", "gate"]),
    ("gatesight/gatesight.safetensors", ["--press", "gatesight"]),
    ("gatesight/gatesight.json", ["--press", "gatesight"]),
    ("tokenizer.json", ["--press", "keydiff"]),
])
def test_a_model_file_that_is_no_file_is_named(model_dir, tmp_path, capsys, kind, file, method):
    directory = shutil.copytree(model_dir, tmp_path / "model")
    (directory / file).unlink()
    MAKERS[kind](directory / file)
    code, err = run_cli(capsys, "compare", "--model", directory, *method, *SMALL_RUN, "--out", tmp_path / "out")
    assert code == 2 and f"{directory / file}: " in err and "move it away" in err, err


@pytest.mark.parametrize("value", [5, ["model.safetensors"]])
def test_a_weight_file_name_that_is_no_name_is_named(model_dir, tmp_path, capsys, no_model_load, value):
    """Probe 68: transformers' raw AttributeError (``'int' object has no attribute 'endswith'``)."""
    directory = shutil.copytree(model_dir, tmp_path / "model")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "transformers_weights": value}))
    code, err = run_cli(capsys, "compare", "--model", directory, "--press", "keydiff", *SMALL_RUN, "--out",
                        tmp_path / "out")
    assert code == 2 and "config.json: transformers_weights is" in err and "give one, or remove the key" in err, err


@pytest.mark.parametrize("report", ["summary.md", "curves.png"])
def test_a_report_that_is_a_pipe_is_refused_before_any_work(model_dir, tmp_path, capsys, no_model_load, report):
    """Probe 68: compare did all its work, then waited forever reading the pipe it was to rebuild."""
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / report)
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--press", "keydiff", *SMALL_RUN, "--out", out)
    # the folder given is named, and the pipe inside it (the re-probe of 64: "--out OUT/summary.md: … give a file")
    assert code == 2 and f"--out {out}: holds a pipe at {out / report}, where this command keeps a file" in err, err


def test_a_label_shard_that_is_a_pipe_is_named(model_dir, tmp_path, capsys):
    labels = tmp_path / "labels"
    assert run_cli(capsys, "label", "--model", model_dir, "--out", labels, "--limit", "1", "--tokens", "48",
                   "--continuations", "1", "--max-new-tokens", "4")[0] == 0
    [shard] = labels.glob("*.safetensors")
    shard.unlink()
    os.mkfifo(shard)
    code, err = run_cli(capsys, "train", "--model", model_dir, "--labels", labels, "--out", tmp_path / "estimator")
    assert code == 2 and f"{shard}: not a regular file, where a label shard belongs" in err, err


@pytest.mark.parametrize("name", ["leaderboard.md", "leaderboard.sha256"])
def test_a_published_file_that_is_a_pipe_is_named_by_verify(model_dir, tmp_path, capsys, name):
    """Probe 68: a pipe at leaderboard.md hung ``verify --docs``; one at leaderboard.sha256 was called missing."""
    store = tmp_path / "store"
    assert run_cli(capsys, "compare", "--model", model_dir, "--press", "keydiff,none", *SMALL_RUN, "--out",
                   store)[0] == 0
    docs = tmp_path / "docs"
    assert run_cli(capsys, "leaderboard", store, "--out", docs)[0] == 0
    (docs / name).unlink()
    os.mkfifo(docs / name)
    code, err = run_cli(capsys, "verify", store, "--docs", docs)
    assert code == 2 and f"{docs / name}: not a regular file, where a published leaderboard file belongs" in err, err


@pytest.mark.parametrize("name", ["leaderboard.md", "leaderboard.csv", "leaderboard.png", "leaderboard-2.png",
                                  "leaderboard.html", "leaderboard.sha256"])
def test_a_folder_at_a_leaderboard_file_is_refused_before_any_work(model_dir, tmp_path, capsys, name):
    """Probe 70: leaderboard wrote some files, then raised IsADirectoryError at the folder."""
    store = tmp_path / "store"
    assert run_cli(capsys, "compare", "--model", model_dir, "--press", "keydiff,none", *SMALL_RUN, "--out",
                   store)[0] == 0
    docs = tmp_path / "docs"
    (docs / name).mkdir(parents=True)
    code, err = run_cli(capsys, "leaderboard", store, "--out", docs)
    said = f"--out {docs}: holds a directory at {docs / name}, where this command keeps a file"
    assert code == 2 and said in err, err
    assert [path.name for path in docs.iterdir()] == [name]


@pytest.mark.slow  # ~6 s: two runs and two builds; CI's slow run holds it
def test_a_leaderboard_stopped_half_way_leaves_the_last_one_whole(model_dir, tmp_path, capsys, monkeypatch):
    """Probes 70 and 71: a build stopped half way left its own files looking written by hand to the next build, or
    its new image beside the last build's tables, which verify passed. Now nothing of it reaches the folder."""
    from bench.reports import leaderboard

    small, large = tmp_path / "small", tmp_path / "large"
    for store, n in ((small, "1"), (large, "2")):
        assert run_cli(capsys, "compare", "--model", model_dir, "--press", "keydiff,none", *SMALL_RUN[:-1], n,
                       "--out", store)[0] == 0
    docs = tmp_path / "docs"
    assert run_cli(capsys, "leaderboard", small, "--out", docs)[0] == 0
    before = {path.name: path.read_bytes() for path in docs.iterdir()}

    def stopped(path, text):  # the build stops at its markdown, once its image is drawn
        if path.name == leaderboard.MARKDOWN:
            raise KeyboardInterrupt
        return original(path, text)

    original = leaderboard.write_text
    monkeypatch.setattr(leaderboard, "write_text", stopped)
    assert run_cli(capsys, "leaderboard", large, "--out", docs)[0] == 130
    assert {path.name: path.read_bytes() for path in docs.iterdir()} == before
    monkeypatch.setattr(leaderboard, "write_text", original)
    assert run_cli(capsys, "verify", small, "--docs", docs)[0] == 0
    assert run_cli(capsys, "leaderboard", large, "--out", docs)[0] == 0
    assert run_cli(capsys, "verify", large, "--docs", docs)[0] == 0


@pytest.mark.slow  # ~3 s: a run and two builds; CI's slow run holds it
def test_a_second_leaderboard_into_the_same_folder_at_once_is_refused(model_dir, tmp_path, capsys, monkeypatch):
    """Probe 71: two builds into one --out both exited 0, the folder mixing their files."""
    from bench.reports import leaderboard

    store = tmp_path / "store"
    assert run_cli(capsys, "compare", "--model", model_dir, "--press", "keydiff,none", *SMALL_RUN, "--out",
                   store)[0] == 0
    docs = tmp_path / "docs"
    original = leaderboard._build
    inner = []

    def build_meanwhile(rows, out, resamples):  # a second build starts while the first one builds
        inner.append(run_cli(capsys, "leaderboard", store, "--out", docs))
        return original(rows, out, resamples)

    monkeypatch.setattr(leaderboard, "_build", build_meanwhile)
    assert run_cli(capsys, "leaderboard", store, "--out", docs)[0] == 0
    [(code, err)] = inner
    assert code == 2 and f"--out {docs}: another bench leaderboard is writing there now" in err, err
    monkeypatch.setattr(leaderboard, "_build", original)
    assert run_cli(capsys, "verify", store, "--docs", docs)[0] == 0


@pytest.mark.parametrize("link", ["symbolic", "hard"])
@pytest.mark.parametrize("name", ["results.jsonl", ".lock"])
def test_a_store_file_that_is_a_link_is_not_written_through(model_dir, tmp_path, capsys, name, link):
    """Probes 69 and 70: rows were appended through a results.jsonl linked to a model's config.json (the model no
    longer loaded), and a linked .lock had its target cut to a pid — through a symbolic link, then a hard one."""
    target = tmp_path / "elsewhere.json"
    target.write_text('{"kept": true}\\n')
    out = tmp_path / "out"
    out.mkdir()
    if link == "symbolic":
        (out / name).symlink_to(target)
    else:
        os.link(target, out / name)
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--press", "keydiff", *SMALL_RUN, "--out", out)
    named = f"a link to {target}" if link == "symbolic" else "one file with 2 names (a hard link"
    assert code == 2 and f"{out / name}: {named}" in err and "a store writes its own files" in err, err
    assert target.read_text() == '{"kept": true}\\n'


@pytest.mark.parametrize("command", [["verify"], ["merge", "--out", "{tmp}/merged"]])
def test_a_lock_that_is_a_pipe_is_named_by_readers(tmp_path, capsys, command):
    """Probe 69: verify, merge and leaderboard waited forever opening a pipe at a store's .lock."""
    store = tmp_path / "store"
    store.mkdir()
    (store / "results.jsonl").write_text("")
    os.mkfifo(store / ".lock")
    argv = [part.format(tmp=tmp_path) for part in command]
    code, err = run_cli(capsys, argv[0], store, *argv[1:])
    assert code == 2 and f"{store / '.lock'}: not a regular file, where a store's lock belongs" in err, err


def test_a_reports_hash_record_that_is_a_folder_is_refused_before_any_work(model_dir, tmp_path, capsys,
                                                                          no_model_load):
    """Probe 69: compare did all its work, moved summary.md aside, then raised IsADirectoryError (exit 1)."""
    out = tmp_path / "out"
    (out / ".summary.md.sha256").mkdir(parents=True)
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--press", "keydiff", *SMALL_RUN, "--out", out)
    said = f"--out {out}: holds a directory at {out / '.summary.md.sha256'}, where this command keeps a file"
    assert code == 2 and said in err, err


def test_an_out_that_is_a_dangling_link_is_named(model_dir, tmp_path, capsys, no_model_load):
    """Probe 69: only "[Errno 17] File exists"."""
    (tmp_path / "out").symlink_to(tmp_path / "gone")
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--press", "keydiff", *SMALL_RUN, "--out",
                        tmp_path / "out")
    assert code == 2 and f"{tmp_path / 'out'} is a link to {tmp_path / 'gone'}, which does not exist" in err, err


def test_a_model_given_as_dot_is_recorded_by_its_folders_name(model_dir, tmp_path, capsys, monkeypatch):
    """Probe 69: ``--model .`` recorded the model as "", so the same model by its path was another model."""
    monkeypatch.chdir(model_dir)
    assert run_cli(capsys, "compare", "--model", ".", "--press", "keydiff,none", *SMALL_RUN, "--out",
                   tmp_path / "out")[0] == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert {row["model"] for row in rows} == {model_dir.name}


def test_artifacts_replaced_while_a_run_starts_are_refused(model_dir, tmp_path, capsys, monkeypatch):
    """Probe 69: a calibration installed between the run's fingerprint and the presses' loading was used under the
    old fingerprint (verify passed the rows)."""
    from presses.calibration import Calibration
    from pretrained import loading

    model = copy_model(model_dir, tmp_path)
    real = loading.load

    def load_after_a_replacement(info):  # the run has fingerprinted the model: a `bench calibrate --replace` now
        calibration = Calibration.load(model)
        calibration.gate_weights = {layer: weight / 2 for layer, weight in calibration.gate_weights.items()}
        calibration.save(model)
        return real(info)

    monkeypatch.setattr(loading, "load", load_after_a_replacement)
    code, err = run_cli(capsys, "compare", "--model", model, "--press", "triattention", *SMALL_RUN, "--out",
                        tmp_path / "out")
    assert code == 2 and "its estimator or calibration changed while this run started" in err, err


@pytest.mark.parametrize("command, named", [(["merge", "{store}", "--out", "{pipe}"], "{pipe}: is a pipe, not a "
                                                                                        "directory on disk"),
                                            (["verify", "{store}", "--docs", "{pipe}"], "{pipe} is not a regular "
                                                                                        "file, not a directory")])
def test_a_pipe_where_a_folder_belongs_is_not_called_a_file(tmp_path, capsys, command, named):
    """Probe 70: a pipe (or /dev/null) given as a folder was called "a file"."""
    store = tmp_path / "store"
    store.mkdir()
    (store / "results.jsonl").write_text("")
    os.mkfifo(tmp_path / "pipe")
    argv = [part.format(store=store, pipe=tmp_path / "pipe") for part in command]
    code, err = run_cli(capsys, *argv)
    assert code == 2 and named.format(pipe=tmp_path / "pipe") in err, err


@pytest.mark.slow  # ~3 s: a run and a build; CI's slow run holds it
def test_a_stop_once_the_leaderboard_is_in_place_says_it_is(model_dir, tmp_path, capsys, monkeypatch):
    """Probe 72: a build moved in whole, then stopped (its last line blocked on a paused terminal), said it did not
    resume and had to be run again."""
    from bench.commands import leaderboard_command

    store = tmp_path / "store"
    assert run_cli(capsys, "compare", "--model", model_dir, "--press", "keydiff,none", *SMALL_RUN, "--out",
                   store)[0] == 0
    docs = tmp_path / "docs"
    built = leaderboard_command.write_leaderboard

    def built_then_stopped(*args, **kwargs):
        built(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(leaderboard_command, "write_leaderboard", built_then_stopped)
    code, err = run_cli(capsys, "leaderboard", store, "--out", docs)
    assert code == 130 and f"{docs} holds the new leaderboard (put in place whole before it stopped)" in err, err
    monkeypatch.undo()
    assert run_cli(capsys, "verify", store, "--docs", docs)[0] == 0


@pytest.mark.parametrize("reader", ["closed early", "a full disk", "not there"])
@pytest.mark.slow  # ~4 s each: a run and a process; CI's slow run holds it
def test_standard_output_that_fails_is_named_as_such(model_dir, tmp_path, capsys, reader):
    """Probe 72: `bench verify | head -1` ended in a BrokenPipeError traceback, and a full stdout (> /dev/full) was
    called a full disk under the store; probe 73: a closed one (``>&-``, None in Python) was an AttributeError."""
    import subprocess
    import sys

    store = tmp_path / "store"
    assert run_cli(capsys, "compare", "--model", model_dir, "--press", "keydiff,none", *SMALL_RUN, "--out",
                   store)[0] == 0
    argv = [sys.executable, "-m", "bench.entry", "verify", str(store)]
    if reader == "closed early":
        verify = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        verify.stdout.close()
        err = verify.stderr.read()
        assert verify.wait(timeout=120) == 141 and err == "", err
    elif reader == "a full disk":
        with open("/dev/full", "w") as full:
            done = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip() == ("bench verify: error: standard output: No space left on device; what it "
                                       "printed there is cut short"), done.stderr
    else:
        done = subprocess.run(argv, stderr=subprocess.PIPE, text=True, timeout=120, preexec_fn=lambda: os.close(1))
        assert done.returncode == 0 and done.stderr == "", done.stderr


@pytest.mark.slow  # ~9 s: two processes; CI's slow run holds it
def test_standard_error_that_fails_ends_the_run_with_its_code(model_dir, tmp_path):
    """Probe 73: a full or closed standard error (the progress bar's) ended compare in an uncaught error, exit 1;
    nothing can say it, the exit code does."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "bench.entry", "compare", "--model", str(model_dir), "--press", "keydiff",
            *map(str, SMALL_RUN), "--out", str(tmp_path / "out")]
    env = {**os.environ, "HYBRIDPRESS_CACHE": str(tmp_path / "cache")}
    with open("/dev/full", "w") as full:
        assert subprocess.run(argv, stderr=full, stdout=subprocess.DEVNULL, env=env, timeout=300).returncode == 2
        verify = [sys.executable, "-m", "bench.entry", "verify", str(tmp_path / "out")]  # probe 74: both streams full
        assert subprocess.run(verify, stdout=full, stderr=full, env=env, timeout=300).returncode == 2


@pytest.mark.parametrize("make", ["device", "pipe"])
def test_a_gguf_that_is_a_device_or_a_pipe_is_named_so(tmp_path, capsys, make):
    """Probe 7: ``fetch-model NAME --gguf /dev/zero`` said "no such file" of a path that exists."""
    given = Path("/dev/zero") if make == "device" else tmp_path / "pipe"
    if make == "pipe":
        os.mkfifo(given)
    code, err = run_cli(capsys, "fetch-model", "smollm2-135m-instruct", "--gguf", given, "--cache", tmp_path / "c")
    assert code == 2 and f"--gguf {given}: not a regular file (a device or a pipe)" in err, err


def test_a_calibration_folder_that_is_a_link_says_to_replace_the_link(model_dir, tmp_path, capsys):
    """Probe 7: calibrate refused a model whose calibration/ is a link with "give the real path", which no option of
    calibrate takes."""
    model = shutil.copytree(model_dir, tmp_path / "model")
    shutil.move(model / "calibration", tmp_path / "elsewhere")
    (model / "calibration").symlink_to(tmp_path / "elsewhere")
    code, err = run_cli(capsys, "calibrate", "--model", model, "--replace")
    assert code == 2 and "is a link (to " in err and "replace the link by the folder it names" in err, err

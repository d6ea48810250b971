"""One error boundary: every subcommand, given a bad value for any one of its options, exits 2 with one line on
stderr that names the option or the value, no traceback, before any model loads or any work starts. The options are
read from the parser itself (:func:`bench.commands.cli.build_parser`), so that a new option is walked too: its type says
what a bad value is (:data:`BY_TYPE`), or its name does (:data:`BY_NAME`), or the walk fails naming it."""

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from bench.commands import arguments, compare_command, distill_commands
from bench.commands.cli import build_parser, main
from runtime.errors import UsageError
from runtime.options import real, whole
from tests.helpers import published_rows, run_cli

MISSING, A_FILE, A_DIR, NO_WEIGHTS = "<missing>", "<a file>", "<a directory>", "<a model without weights>"
"""Bad paths, made for each case under its tmp_path."""

BY_TYPE = {
    arguments.count: ["0", "-1", "2.5", "abc"],
    arguments.natural: ["-1", "2.5", "abc"],
    arguments.positive: ["0", "nan", "abc"],
    arguments.nonnegative: ["-1", "inf", "abc"],
    arguments.share: ["1.5", "nan"],
    int: ["-1", "2.5", "abc"],
    arguments.names: ["nosuch"],
    arguments.ints: ["0", "abc", "64,64"],
    arguments.part: ["3/2", "x"],
    arguments.options: ["nosuch=1"],
    compare_command.method_pairs: ["nosuch/flat", "snapkv[window=64/flat", "snapkv[windw=64]/flat"],
    compare_command.spec_list: ["nosuch", "snapkv[window=64", "snapkv]"],
    compare_command.keep_fractions: ["1.5", "abc"],
    compare_command.compression_ratios: ["1.0"],
    distill_commands._layer_list: ["-1", "abc", "99"],
}
"""Bad values of an option by its type: each refused whatever the option means."""
BY_NAME = {
    "model": ["smollm2-135m", MISSING, NO_WEIGHTS], "teacher": ["smollm2-135m"], "name": ["smollm2-135m"],
    "device": ["nosuch"], "dtype": ["nosuch"], "profile": ["nosuch"], "haystack": ["nosuch"], "address": ["nosuch"],
    "out": [A_FILE], "checkpoints": [A_FILE], "cache": [A_FILE], "rows": [A_DIR],
    "labels": [A_FILE, MISSING], "scbench_data": [MISSING], "init_from": [MISSING], "gguf": [MISSING],
    "docs": [A_FILE], "stores": [MISSING], "imports": ["no_such_module"],
    "store": [MISSING, A_FILE], "artifacts": [MISSING, A_FILE], "into": [A_FILE],
}
"""Bad values of a text option (a name, a path) by its name."""

BASES = {
    "compare": ["--model", "{model}", "--tasks", "niah_single_1", "--n", "1", "--length", "300", "--out", "{tmp}/out"],
    "merge": ["{store}", "--out", "{tmp}/merged"],
    "leaderboard": ["{store}", "--out", "{tmp}/docs"],
    "verify": ["{store}"],
    "carry": ["{store}", "--model", "{model}"],
    "publish": ["{store}", "--into", "{tmp}/collection"],
    "cost": ["--model", "{model}", "--press", "keydiff", "--lengths", "64", "--out", "{tmp}/cost"],
    "fetch-model": ["smollm2-135m-instruct", "--cache", "{tmp}/cache"],
    "calibrate": ["--model", "{model}", "--tokens", "256", "--chunk", "128", "--replace"],
    "calibrate-shares": ["--model", "{model}", "--windows", "2", "--tokens", "64", "--replace"],
    "train-model": ["--steps", "5", "--out", "{tmp}/trained", "--checkpoints", "{tmp}/checkpoints"],
    "model-eval": ["--model", "{model}", "--tasks", "niah_single_1", "--lengths", "300", "--n", "1"],
    "distill": ["--checkpoints", "{tmp}/checkpoints", "--hours", "0.001", "--out", "{tmp}/delta"],
    "ship-artifacts": ["smollm2-135m-hybrid", "--cache", "{tmp}/cache"],
    "label": ["--model", "{model}", "--limit", "1", "--tokens", "48", "--continuations", "1", "--max-new-tokens",
              "4", "--out", "{tmp}/labels"],
    "train": ["--model", "{model}", "--labels", "{tmp}/labels", "--epochs", "1", "--out", "{tmp}/estimator"],
    "analyze": ["--model", "{model}", "--labels", "{tmp}/labels", "--out", "{tmp}/analysis"],
}
"""A command line of each subcommand that would start its work (the options not given take their defaults)."""


def _subparsers() -> dict:
    [choices] = [action.choices for action in build_parser()._actions if action.dest == "command"]
    return choices


def _bad_values(action) -> list[str] | None:
    if isinstance(action, compare_command.GoneFlag):  # a removed flag: refused whatever its value
        return ["0.5"]
    if action.choices is not None:
        return ["nosuch"]
    if action.type in BY_TYPE:
        return BY_TYPE[action.type]
    return BY_NAME.get(action.dest)


def _walk() -> list:
    cases = []
    for name, parser in _subparsers().items():
        for action in parser._actions:
            if action.nargs == 0 or action.dest in ("help", "debug"):  # flags take no value
                continue
            flag = action.option_strings[0] if action.option_strings else None
            values = _bad_values(action)
            assert values is not None, (f"bench {name} {flag or action.dest}: no bad value known for this option; "
                                        "give it a typed argument (bench/commands/arguments.py) or name it in BY_NAME")
            if flag is not None and "" not in values:  # never a name nor a path ('' is the current folder)
                values = [*values, ""]
            cases += [pytest.param(name, flag, value, id=f"{name} {flag or action.dest} {value}") for value in values]
    return cases


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A small complete store: the first item of every context of the committed default model's 4,096-token group,
    its run's record left out (a run's rows must hold every item of it, so item 0 alone of a run is an incomplete
    store, refused as such before a bad value of another option is reached; rows that record no run, as those written
    before runs were recorded, are complete alone)."""
    rows = [{key: value for key, value in row.items() if key not in ("run", "questions", "batch")}
            for row in published_rows() if row["item"] == 0 and row["model"] == "hybrid-byte-12l"
            and row["length"] == 4096]
    assert rows, "the committed store holds no default-model group at 4,096 tokens; pick another small complete store"
    directory = tmp_path_factory.mktemp("store")
    (directory / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return directory


def _path(value: str, tmp_path: Path, model_dir: Path) -> str:
    if value == MISSING:
        return str(tmp_path / "missing")
    if value == A_FILE:
        (tmp_path / "a-file").write_text("kept")
        return str(tmp_path / "a-file")
    if value == A_DIR:
        (tmp_path / "a-dir").mkdir()
        return str(tmp_path / "a-dir")
    if value == NO_WEIGHTS:
        directory = shutil.copytree(model_dir, tmp_path / "no-weights", ignore=shutil.ignore_patterns("*.safetensors"))
        return str(directory)
    return value


@pytest.mark.parametrize("command, flag, value", _walk())
def test_a_bad_value_is_one_line_and_exit_2(command, flag, value, model_dir, store, tmp_path, capsys, guarded):
    model = shutil.copytree(model_dir, tmp_path / "model", ignore=shutil.ignore_patterns("calibration"))
    argv = [part.format(model=model, tmp=tmp_path, store=store) for part in BASES[command]]
    value = _path(value, tmp_path, model_dir)
    if flag is None:  # the positional argument: the first of the base
        argv[0] = value
    elif flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    code = main([command, *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"bench {command}: error: "), err
    named = [flag, value, *re.split("[/,=]", value)]  # the option, its value, or the part of it that is bad
    assert "Traceback" not in err and any(part and part in err for part in named), err


def test_a_near_miss_model_name_offers_the_catalogue(model_dir, tmp_path, capsys, guarded):
    for argv in (["compare", "--model", "smollm2-135m", "--out", str(tmp_path / "out")],
                 ["fetch-model", "smollm2-135m", "--cache", str(tmp_path / "cache")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "'smollm2-135m'" in err, err
        assert "did you mean smollm2-135m-hybrid or smollm2-135m-instruct?" in err, err


def test_a_press_of_no_one_scale_with_the_global_allocator_is_refused_before_the_model_loads(model_dir, tmp_path,
                                                                                           capsys, guarded):
    assert main(["compare", "--model", str(model_dir), "--press", "snapkv", "--alloc", "global", "--out",
                 str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "snapkv scores each layer on a scale of its own" in err, err


@pytest.mark.parametrize("address, message", [("127.0.0.1:99999", "a port in 1 … 65535"),
                                              ("a" * 70 + ":6379", "no Ray cluster answers there")])
def test_a_ray_address_that_cannot_be_one_is_one_line(address, message):
    from bench.run.settings import check_ray_address

    with pytest.raises(UsageError, match=message):
        check_ray_address(address, timeout=0.5)


@pytest.mark.parametrize("value, parsed", [(5, 5), (__import__("numpy").int64(5), 5), ("5", 5)])
def test_a_count_is_an_integer_of_python_or_numpy(value, parsed):
    assert whole(value, "n", 1) == parsed and type(whole(value, "n", 1)) is int


@pytest.mark.parametrize("value", [2.5, 5.0, "2.5", True, None, "five", 0])
def test_a_count_is_never_rounded(value):
    with pytest.raises(UsageError, match=f"^max_new_tokens must be an integer >= 1, got {value!r}$".replace(
            "(", r"\(").replace(")", r"\)")):
        whole(value, "max_new_tokens", 1)


def test_a_real_is_a_number_of_python_or_numpy():
    np = pytest.importorskip("numpy")
    assert real(np.float32(0.5), "p", 0, 1) == 0.5 and type(real(np.float32(0.5), "p", 0, 1)) is float
    assert real(np.int64(1), "p", 0, 1) == 1.0
    for bad in (float("nan"), float("inf"), True, "x", 1.5):
        with pytest.raises(UsageError, match="^p must be a finite number in"):
            real(bad, "p", 0, 1)
    with pytest.raises(UsageError, match=r"^p must be a finite number in \(0, 1\], got 0$"):
        real(0, "p", 0, 1, above=True)


def test_numpy_scalars_are_options_like_python_numbers():
    """``np.float32(0.5)`` and ``np.int64(5)`` were refused as out of range."""
    np = pytest.importorskip("numpy")
    import allocators
    import presses

    assert presses.get("snapkv", window=np.int64(5)).window == 5
    assert allocators.get("adakv", safeguard=np.float32(0.25)).safeguard == 0.25
    assert allocators.check_keep_fraction(np.float32(0.5)) == 0.5
    assert allocators.get("perlayer", weights=[np.int64(1), np.float32(2)]).weights == [1.0, 2.0]
    with pytest.raises(UsageError, match="snapkv option window=2.5: expected an integer"):
        presses.get("snapkv", window=2.5)


@pytest.mark.parametrize("command", [["cost", "--press", "keydiff", "--out"], ["model-eval", "--n", "1", "--rows"]])
def test_a_length_given_twice_is_refused_not_measured_twice(command, tmp_path, capsys, no_model_load):
    assert main([*command, str(tmp_path / "out"), "--lengths", "300,64,300"]) == 2
    err = capsys.readouterr().err
    assert "argument --lengths: 300 given more than once" in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_a_flag_given_twice_is_refused_by_every_command():
    """argparse keeps the last of a flag given twice without a word (`--keep-fractions 0.5 … --keep-fractions 0.25`
    ran 0.25 alone): every command refuses it, by its name, a prefix argparse accepts or `--flag=value`."""
    from bench.commands.cli import repeated_flag

    for name, parser in build_parser().commands.items():
        assert repeated_flag(parser, ["--debug", "x", "--debug"]) == "--debug", name
        assert repeated_flag(parser, ["--debug"]) is None, name
    compare = build_parser().commands["compare"]
    assert repeated_flag(compare, ["--keep", "0.5", "--n", "2", "--keep-fractions=0.25"]) == "--keep-fractions"
    assert repeated_flag(compare, ["--keep-fractions", "0.5", "--", "--keep-fractions"]) is None
    # probe 22, #1: a repeatable flag, each given counts
    assert repeated_flag(compare, ["--import", "a", "--import=b"]) is None
    assert repeated_flag(build_parser().commands["carry"], ["--artifacts", "a", "--artifacts", "b"]) is None


def test_compare_with_keep_fractions_twice_is_refused_before_any_work(tmp_path, capsys, no_model_load):
    from tests.helpers import run_cli

    code, err = run_cli(capsys, "compare", "--keep-fractions", "0.5", "--press", "snapkv", "--keep-fractions", "0.25",
                        "--out", tmp_path / "out")
    assert code == 2 and "--keep-fractions is given twice: give it once (only the last would count)" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text", ["１２", "1_2"])
def test_an_option_in_other_digits_is_refused_as_the_flags_are(text):
    """Probe 70: ``--press-options window=１２`` ran as window=12, where every numeric flag refuses such digits."""
    import presses

    with pytest.raises(UsageError, match=f"snapkv option window='{text}': expected an integer"):
        presses.get("snapkv", window=text)
    assert presses.get("snapkv", window=" 12 ").window == 12


@pytest.mark.parametrize("source, says", [
    ('raise RuntimeError("boom")\n', "importing it raised RuntimeError: boom ({file}:1)"),
    ("x = 1\ndef f(:\n", "importing it raised SyntaxError: "),
    ("import sys\nsys.exit(3)\n", "importing it called sys.exit(3); a module given to the bench registers"),
    # the re-probe of 64: os._exit ended the run 0 and silent; a closed stdout or a module replaced in sys.modules
    # surfaced later as a traceback from the bench's own code
    ("import os\nos._exit(0)\n", "importing it called os._exit(0); a module given to the bench registers"),
    ("import sys\nsys.modules['json'] = None\n", "importing it replaced or removed module(s) json in sys.modules"),
    ("import sys\nsys.modules['not_yet_imported_xyz'] = None\n", "importing it blocked module(s) not_yet_imp"),
    # probe 7: an import inside the module that fails is the module's error, not "give a module importable …"
    ("from presses.snapkv import NoSuchName\n", "importing it raised ImportError: cannot import name 'NoSuchName' "),
    ("import no_such_package_xyz\n", "importing it raised ModuleNotFoundError: No module named 'no_such_package_xyz'"),
    # probe 7: a module that moved the working directory sent a relative --out elsewhere
    ("import os\nos.chdir('/')\n", "importing it changed the working directory"),
])
@pytest.mark.parametrize("command", [["compare", "--press", "keydiff", "--n", "1", "--out", "{tmp}/out"],
                                     ["cost", "--press", "keydiff", "--out", "{tmp}/cost"]])
def test_an_import_that_raises_or_exits_is_one_line(source, says, command, tmp_path, capsys, monkeypatch, guarded):
    """Probe 64: ``--import`` of a module that raised printed a full traceback through bench/entry.py (exit 1); one
    that called sys.exit(3) ended 3 printing nothing. Each is one line naming the module, what it raised and where
    (``--debug`` keeps the traceback)."""
    module = tmp_path / "broken_module.py"
    module.write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "broken_module", raising=False)
    argv = [part.format(tmp=tmp_path) for part in command] + ["--import", "broken_module"]
    code, err = run_cli(capsys, *argv)
    assert code == 2 and "--import broken_module: " in err and says.format(file=module) in err, err
    if "SyntaxError" in says:
        assert f"({module}:2)" in err, err
    assert not (tmp_path / "out").exists() and not (tmp_path / "cost").exists()


@pytest.mark.parametrize("source, says", [
    ("import sys\nsys.stdout.close()\n", "closed or replaced sys.stdout"),
    ("import sys\nsys.stderr.close()\n", "closed or replaced sys.stderr"),
    ("import sys\nsys.stderr = open('/dev/null', 'w')\n", "closed or replaced sys.stderr"),
    # the probe's next try: the descriptors themselves (the refusal went to the closed descriptor 2, unseen)
    ("import os\nos.close(1)\nos.close(2)\n", "closed or replaced file descriptor 1 (stdout), file descriptor 2 "
                                             "(stderr)"),
])
@pytest.mark.slow  # a process each (~3 s): CI's slow run holds them
def test_an_import_that_closes_or_replaces_a_stream_is_one_line_in_a_real_process(source, says, tmp_path):
    """Re-probe of 64: a module closing sys.stdout ended the run in a traceback from the bench's own printing. The
    streams are the process's own (a test's captured ones are not closed), so the bench runs as a user runs it."""
    import subprocess

    (tmp_path / "closer.py").write_text(source)
    done = subprocess.run([sys.executable, "-m", "bench.entry", "compare", "--press", "keydiff", "--n", "1", "--out",
                           str(tmp_path / "out"), "--import", "closer"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}, timeout=300)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"--import closer: importing it {says}; a module given to the bench registers" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # a process of its own: CI's slow run holds it
def test_an_import_that_leaves_a_thread_running_is_refused_and_the_run_still_ends(tmp_path):
    """Probe 7: a module that started a thread that is not a daemon kept the process alive after the run, past
    SIGTERM and Ctrl-C (the console script ignores them once its command is done): only SIGKILL ended it."""
    import subprocess

    (tmp_path / "threaded.py").write_text("import threading, time\n"
                                          "threading.Thread(target=time.sleep, args=(1000,), name='sleeper').start()\n")
    done = subprocess.run([sys.executable, "-m", "bench.entry", "compare", "--press", "keydiff", "--n", "1", "--out",
                           str(tmp_path / "out"), "--import", "threaded"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}, timeout=300)
    assert done.returncode == 2 and "--import threaded: importing it started thread(s) sleeper that are not daemons" \
        in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()  # and it ended: subprocess.run's timeout would have raised


@pytest.mark.parametrize("given", ["../my_press", "my_press.py", "/abs/my_press.py"])
def test_an_import_given_as_a_path_says_to_give_a_modules_name(given, tmp_path, capsys, guarded):
    """Re-probe of 64: ``--import ../x`` said "No module named '../x'"."""
    code, err = run_cli(capsys, "compare", "--press", "keydiff", "--n", "1", "--out", tmp_path / "out", "--import",
                        given)
    assert code == 2 and f"--import {given}: give a module's name, not a path (e.g. --import my_press for " in err, err
    assert not (tmp_path / "out").exists()


def test_rows_given_as_dash_are_refused_not_written_to_a_file_named_dash(tmp_path, capsys, monkeypatch, guarded):
    """Probe 64: ``--rows -`` wrote a regular file named '-' in the current folder. Results are written whole to
    disk and never to a stream (the output policy), so '-' — standard output to many tools — is refused."""
    monkeypatch.chdir(tmp_path)
    for argv in (["model-eval", "--tasks", "niah_single_1", "--lengths", "300", "--n", "1", "--rows", "-"],
                 ["cost", "--press", "keydiff", "--out", "-"]):
        code, err = run_cli(capsys, *argv)
        assert code == 2 and f"{argv[-2]} -: '-' means standard output to many tools" in err, err
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("item", ["snapkv/pyramid[beta=inf]", "snapkv/pyramid[beta=nan]",
                                  "snapkv/perlayer[weights=1/inf/1/1]"])
def test_an_option_of_no_finite_number_is_refused(item, model_dir, tmp_path, capsys, guarded):
    """Probe 64: ``snapkv/pyramid[beta=inf]`` was accepted and run, though beta must be "a number > 0": no option
    takes NaN or an infinity."""
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--methods", item, "--n", "1", "--out",
                        tmp_path / "out")
    assert code == 2 and "expected a finite number, got 'inf'" in err or "got 'nan'" in err, err
    assert not (tmp_path / "out").exists()


def test_a_bad_value_of_press_options_names_that_flag(tmp_path, capsys, no_model_load):
    """Probe 17, U4: a value given in ``--press-options`` was blamed on ``--methods 'kvzip'``; an item's own bracket
    option is still named with its item."""
    from tests.helpers import run_cli

    code, err = run_cli(capsys, "compare", "--methods", "kvzip/flat", "--press-options", "suffix=%C0%80",
                        "--out", tmp_path / "out")
    assert code == 2 and "--press-options, for --methods 'kvzip': kvzip option suffix=" in err, err
    code, err = run_cli(capsys, "compare", "--methods", "kvzip[suffix=%C0%80]/flat", "--out", tmp_path / "out")
    assert code == 2 and "--methods 'kvzip[suffix=%C0%80]': kvzip option suffix=" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("given", "said"), [("file", "not a folder (an artifact's folder is given, which holds its "
                                                        "files)"), ("missing", "no such folder")])
def test_carry_names_an_artifacts_path_that_is_no_folder(tmp_path, capsys, given, said):
    """Probe 23, U2: a file given to ``carry --artifacts`` was called no such folder."""
    from tests.helpers import run_cli

    (tmp_path / "file").write_text("x")
    code, err = run_cli(capsys, "carry", tmp_path / "store", "--artifacts", tmp_path / given)
    assert code == 2 and err.endswith(f"--artifacts {tmp_path / given}: {said}"), err

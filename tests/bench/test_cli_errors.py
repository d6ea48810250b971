"""What a user types wrong is one line on stderr, exit 2, before any model loads or any work is done: empty or
contradicting flags, bad options, an ``--out`` that is a file, a damaged model directory (named), empty work;
Ctrl-C says how to resume."""


import pytest

from bench.commands.cli import main
from bench.run import compare
from bench.run.compare import run_compare
from bench.store.result_store import ResultStore
from tests.helpers import compare_settings, copy_model, run_cli, truncate


@pytest.mark.parametrize("argv, message", [
    (["--keep-fractions", ""], "--keep-fractions is empty"),
    (["--press", ""], "--press is empty"),
    (["--alloc", ""], "--alloc is empty"),
    (["--tasks", ""], "--tasks is empty"),
    (["--press", "kvpress"], "name the kvpress scorer to wrap: kvpress:<ClassName>"),
    (["--press", "kvpress:NoSuchPress"], "'NoSuchPress' is not a kvpress ScorerPress; available: .*KnormPress"),
    (["--length", "10000000"], r"length 10000000 is longer than the model's position limit \(max_position_embeddings "
                               r"= (\d+)\).*give --length <= \1"),
    (["--press", "snapkv", "--alloc", "global"], "snapkv scores each layer on a scale of its own"),
    (["--keep-fractions", "0.5,1.5"], r"argument --keep-fractions: kept fraction 1.5 is outside \(0, 1\]"),
    (["--keep-fractions", "nan"], r"argument --keep-fractions: kept fraction nan is outside \(0, 1\]"),
    (["--keep-fractions=-inf"], r"argument --keep-fractions: kept fraction -inf is outside \(0, 1\]"),
    (["--keep-fractions", "-inf"], r"argument --keep-fractions: expected one argument \(a value that starts with "
                                   r"'-' is given as --keep-fractions=VALUE\)"),
    (["--shard", "-1/3"], r"argument --shard: expected one argument \(a value that starts with '-' is given as "
                          r"--shard=VALUE\)"),
])
def test_cli_errors_come_before_the_model_loads(model_dir, tmp_path, capsys, no_model_load, argv, message):
    code = main(["compare", "--model", str(model_dir), "--out", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("bench compare: error: ") and err.count("\n") == 1
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "out" / "results.jsonl").exists()


def test_a_question_and_its_answer_take_no_position_past_the_length():
    """Why ``--length <= max_position_embeddings`` is the whole check: every context is fitted so that it, its
    question and the answer budget (max new tokens) take at most --length positions."""
    from hybridmodel.tokenizer import build_tokenizer
    from runtime import encode_text
    from workloads.tasks import Config, generate
    from workloads.tasks.ruler import TASKS

    tokenizer = build_tokenizer()
    count = lambda text: len(encode_text(tokenizer, text))  # noqa: E731
    for task in TASKS:
        item = generate(task, 0, 0, Config(length=1024, count_tokens=count))
        for question in item.questions:
            assert count(item.context) + count(question.prompt) + question.max_new_tokens <= 1024, task


def test_out_that_is_a_file_is_refused_before_work(model_dir, tmp_path, no_model_load):
    (tmp_path / "file").write_text("x")
    for out in (tmp_path / "file", tmp_path / "file" / "below"):
        with pytest.raises(ValueError, match="is a file, not a directory"):
            run_compare(compare_settings(model_dir, out), show_progress=False)


def test_cost_refuses_bad_lengths_before_work(model_dir, tmp_path, capsys, no_model_load):
    assert main(["cost", "--model", str(model_dir), "--lengths", "0", "--out", str(tmp_path)]) == 2
    assert "length 0 is not allowed" in capsys.readouterr().err


@pytest.mark.parametrize("given", [["kvpress:knorm", "kvpress:KnormPress"], ["snapkv", "snapkv"]])
def test_cost_refuses_one_press_named_twice(model_dir, tmp_path, capsys, no_model_load, given):
    """A kvpress short name and its class name are one press: timed twice, its row would show twice."""
    code, err = run_cli(capsys, "cost", "--model", model_dir, "--press", ",".join(given), "--lengths", 16,
                        "--out", tmp_path / "out")
    assert code == 2 and f"--press names one press twice: {given[0]!r} and {given[1]!r}" in err, err
    assert not (tmp_path / "out").exists()


def test_ctrl_c_says_how_to_resume(model_dir, tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(compare, "execute", interrupted)
    (tmp_path / "results.jsonl").write_text("")  # rows of an earlier run: kept, and a rerun resumes after them
    assert main(["compare", "--model", str(model_dir), "--out", str(tmp_path)]) == 130
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"what was finished is kept in {tmp_path}" in err and "resume" in err, err


@pytest.mark.parametrize("made", [False, True])
def test_ctrl_c_before_the_first_row_says_nothing_was_written(model_dir, tmp_path, capsys, monkeypatch, made):
    """Stopped before it wrote anything, --out is not said to keep what was finished."""
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(compare, "execute", interrupted)
    out = tmp_path / "out"
    if made:
        out.mkdir()
    assert main(["compare", "--model", str(model_dir), "--out", str(out)]) == 130
    err = capsys.readouterr().err.strip()
    says = "holds no file" if made else "was not created"
    assert f"nothing was written yet ({out} {says}); run the same command again to start" in err, err
    assert "kept in" not in err


def test_sigterm_is_an_interrupt_that_cleans_up(model_dir, tmp_path, capsys, monkeypatch):
    """``timeout`` or ``kill`` stop a command as Ctrl-C does: a temporary folder it holds (a model half converted by
    fetch-model) is removed, and it says so in one line (exit 143)."""
    import os
    import signal
    import tempfile
    import time

    held = []

    def terminated(*args, **kwargs):
        with tempfile.TemporaryDirectory(dir=tmp_path) as scratch:
            held.append(scratch)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # the handler raises here
    monkeypatch.setattr(compare, "execute", terminated)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["compare", "--model", str(model_dir), "--out", str(tmp_path / "out")]) == 143
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "bench compare: terminated; nothing was written yet" in err, err
    assert held and not os.path.exists(held[0])
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_a_library_wraps_in_another_error_is_still_a_stop(model_dir, tmp_path, capsys, monkeypatch):
    """Probe 69: SIGTERM during matplotlib's import (a pybind11 module) surfaced as a raw ``ImportError:
    initialization failed`` raised from the interrupt."""
    from bench.run import stopping

    def import_stopped(*args, **kwargs):
        try:
            raise stopping.Terminated
        except KeyboardInterrupt as stop:
            raise ImportError("initialization failed") from stop
    monkeypatch.setattr(compare, "execute", import_stopped)
    assert main(["compare", "--model", str(model_dir), "--out", str(tmp_path / "out")]) == 143
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "bench compare: terminated; nothing was written yet" in err, err


def test_model_eval_interrupted_keeps_the_rows_of_the_tasks_it_finished_and_says_so(model_dir, tmp_path, capsys,
                                                                                    monkeypatch):
    """Ctrl-C during the second task: the first task's rows are in --rows, as the message says (they were lost)."""
    import json

    from bench.run import model_eval

    calls = []

    def generate(task, index, seed, config):
        calls.append(task)
        if task == "niah_single_2" and calls.count(task) > 1:  # its first call checks it fits, before any answer
            raise KeyboardInterrupt
        return real(task, index, seed, config)

    real = model_eval.generate
    monkeypatch.setattr(model_eval, "generate", generate)
    rows = tmp_path / "rows.jsonl"
    code, err = run_cli(capsys, "model-eval", "--model", model_dir, "--tasks", "niah_single_1,niah_single_2",
                        "--lengths", "300", "--n", "2", "--rows", rows)
    assert code == 130 and f"interrupted; the rows of the tasks it finished are kept in {rows}" in err, err
    assert {json.loads(line)["task"] for line in rows.read_text().splitlines()} == {"niah_single_1@300"}
    assert len(rows.read_text().splitlines()) == 2


def test_model_eval_interrupted_before_a_task_finished_says_nothing_was_written(model_dir, tmp_path, capsys,
                                                                               monkeypatch):
    """Ctrl-C during the first task: no row is written yet, and the message does not claim any were kept."""
    from bench.run import model_eval

    calls = []

    def generate(task, index, seed, config):
        calls.append(task)
        if len(calls) > 1:  # the first call checks the task fits, before any answer
            raise KeyboardInterrupt
        return real(task, index, seed, config)

    real = model_eval.generate
    monkeypatch.setattr(model_eval, "generate", generate)
    rows = tmp_path / "rows.jsonl"
    code, err = run_cli(capsys, "model-eval", "--model", model_dir, "--tasks", "niah_single_1", "--lengths", "300",
                        "--n", "2", "--rows", rows)
    assert code == 130 and f"no task finished, so nothing was written yet ({rows} was not created)" in err, err
    assert "kept" not in err and not rows.exists()


@pytest.mark.parametrize("command, argv, says", [
    ("train", ["--labels", "{tmp}/labels", "--out", "{tmp}/est"], "nothing was written: {tmp}/est holds what it held "
                                                                  "before"),
    ("calibrate", [], "nothing was written: {model}/calibration holds what it held before"),
])
def test_ctrl_c_says_what_each_command_keeps(model_dir, tmp_path, capsys, monkeypatch, command, argv, says):
    """Only compare and label resume; train and calibrate write their result whole at the end."""
    import shutil

    import bench.commands.learning_commands

    model = shutil.copytree(model_dir, tmp_path / "model", ignore=shutil.ignore_patterns("calibration*"))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench.commands.learning_commands, {"train": "train", "calibrate": "calibrate_model"}[command],
                        interrupted)
    code, err = run_cli(capsys, command, "--model", model, *(a.format(tmp=tmp_path) for a in argv))
    assert code == 130 and says.format(tmp=tmp_path, model=model) in err and "it does not resume" in err, err


def test_press_and_allocator_options_from_the_cli(model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["compare", "--model", str(model_dir), "--out", str(out), "--press", "snapkv", "--press-options",
                 "window=8,kernel=3", "--alloc", "perlayer", "--alloc-options", "weights=1/3", "--keep-fractions",
                 "0.5", "--tasks", "niah_single_1", "--n", "1", "--length", "300"]) == 0
    rows = ResultStore(out, readonly=True).rows
    assert {r["press"] for r in rows} == {"none", "snapkv(kernel=3,window=8)"}
    assert {r["allocator"] for r in rows} == {"none", "perlayer(weights=1;3)"}
    capsys.readouterr()
    assert main(["compare", "--model", str(model_dir), "--out", str(out), "--press", "snapkv",
                 "--press-options", "windw=8"]) == 2
    assert "snapkv has no option 'windw'; valid: window, kernel, gqa" in capsys.readouterr().err
    assert main(["compare", "--model", str(model_dir), "--out", str(out), "--press", "snapkv",
                 "--press-options", "window=-1"]) == 2
    assert "window=-1: expected an integer >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--alloc", "perlayer", "--alloc-options", "weights=5"],
     "perlayer has 1 weights; the model has 2 attention layers"),
    (["--alloc", "adakv", "--alloc-options", "safeguard=abc"], "adakv option safeguard='abc': expected a number"),
    (["--alloc", "perlayer", "--alloc-options", "weights=abc"], "perlayer option weights='abc'"),
    (["--press", "keydiff", "--press-options", "normalized_anchor=maybe"], "expected true or false"),
    (["--press", "kvpress:ScorerPress"], "kvpress:ScorerPress is the abstract base of kvpress's scorers"),
])
def test_bad_options_are_refused_before_the_model_loads(model_dir, tmp_path, capsys, no_model_load, argv, message):
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--out", tmp_path / "out", *argv)
    assert code == 2 and message in err, err
    assert not (tmp_path / "out" / "results.jsonl").exists()


@pytest.mark.parametrize("argv, given", [
    (["--n", "2_0"], "2_0"), (["--n", "\uff12"], "\uff12"), (["--length", "1_024"], "1_024"),
    (["--keep-fractions", "0.1,0_5"], "0.1,0_5"), (["--shard", "0/\u0662"], "0/\u0662"), (["--seed", "1_0"], "1_0"),
])
def test_numbers_are_written_in_ascii_digits(model_dir, tmp_path, capsys, no_model_load, argv, given):
    """Python reads "2_0" as 20 and a full-width "２" as 2: no one typing a count means either (probe 60)."""
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--out", tmp_path / "out", *argv)
    assert code == 2 and f"expected a number in ASCII digits (no '_'), got {given!r}" in err, err
    assert "\n" not in err.strip() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("damage, message", [
    (lambda d: truncate(d / "model.safetensors"), "model.safetensors: not a complete safetensors file"),
    (lambda d: truncate(d / "gatesight" / "gatesight.safetensors"),
     "gatesight.safetensors: not a complete safetensors file"),
    (lambda d: truncate(d / "calibration" / "calibration.safetensors"),
     "calibration.safetensors: not a complete safetensors file"),
    (lambda d: [p.unlink() for p in d.glob("tokenizer*")], "no tokenizer vocabulary — tokenizer.json"),
    (lambda d: (d / "tokenizer.json").unlink(), "tokenizer_config.json alone holds the settings, not the vocabulary"),
    (lambda d: (d / "config.json").write_text("{not json"), "config.json: not valid JSON"),
])
def test_a_damaged_model_directory_is_named(model_dir, tmp_path, capsys, damage, message):
    copy = copy_model(model_dir, tmp_path)
    damage(copy)
    code, err = run_cli(capsys, "compare", "--model", copy, "--out", tmp_path / "out", "--press", "gatesight",
                     "--keep-fractions", "0.5", "--tasks", "niah_single_1", "--n", "1", "--length", "300")
    assert code == 2 and str(copy) in err and message in err, err


@pytest.mark.parametrize("typed", [["--ratios", "0.5"], ["--ratios=0.5"], ["--ratios"], ["--ratio", "0.5"],
                                   ["--keep-fractions", "0.5", "--ratios", "0.5"]])
def test_the_removed_ratios_flag_is_refused_naming_both_flags(tmp_path, capsys, no_model_load, typed):
    """``--ratios`` was an alias of ``--keep-fractions`` (kept) while a ratio everywhere else is the evicted fraction:
    given in any form, or shortened (argparse's prefix matching passes on no shortened flag to another), it is one
    line that says why it is gone and names both flags, and nothing is written."""
    out = tmp_path / "out"
    code, err = run_cli(capsys, "compare", *typed, "--out", out)
    assert code == 2 and err.startswith("bench compare: error: --ratios is gone: it meant kept fractions p"), err
    assert "--keep-fractions (kept, p in (0, 1])" in err and "--compression-ratios (evicted, 1 − p in [0, 1))" in err
    assert not out.exists()


def test_fractions_are_given_one_way_and_checked_as_typed(capsys):
    code, err = run_cli(capsys, "compare", "--keep-fractions", "0.5", "--compression-ratios", "0.9")
    assert code == 2 and "not allowed with argument" in err
    code, err = run_cli(capsys, "compare", "--compression-ratios", "0.5,1")
    assert code == 2 and "compression ratio 1 is outside [0, 1)" in err
    code, err = run_cli(capsys, "compare", "--compression-ratios", "0.99999999999")  # probe 62: named p = 0.0
    assert code == 2 and "compression ratio 0.99999999999 keeps nothing: its kept fraction 1 − 0.99999999999 " \
                         "rounds to 0 at 10 digits" in err, err


def test_model_eval_and_calibrate_refuse_empty_work(model_dir, capsys, no_model_load):
    code, err = run_cli(capsys, "model-eval", "--model", model_dir, "--n", "0")
    assert code == 2 and "argument --n: must be an integer >= 1, got '0'" in err
    code, err = run_cli(capsys, "calibrate", "--model", model_dir, "--tokens", "0")
    assert code == 2 and "argument --tokens: must be an integer >= 1, got '0'" in err


def test_model_eval_names_the_task_and_length_that_cannot_fit_before_answering(model_dir, capsys, monkeypatch):
    import runtime

    monkeypatch.setattr(runtime.Parent, "answer", lambda *a, **k: pytest.fail("answered before the refusal"))
    code, err = run_cli(capsys, "model-eval", "--model", model_dir, "--tasks", "niah_single_1,niah_multikey_2",
                        "--lengths", "4096,100", "--n", "1")
    assert code == 2 and "\n" not in err, err
    assert "task 'niah_single_1' at length 100: length 100 is too short" in err


def test_model_eval_of_a_group_names_its_tasks_that_fit(model_dir, capsys, monkeypatch):
    """A group with a task too long for a length is refused with the tasks that fit every length, as --tasks to give
    instead (ruler's cwe needs about 844 byte tokens; the others fit 512); nothing is answered."""
    import runtime
    from workloads.tasks.registry import expand

    monkeypatch.setattr(runtime.Parent, "answer", lambda *a, **k: pytest.fail("answered before the refusal"))
    code, err = run_cli(capsys, "model-eval", "--model", model_dir, "--tasks", "ruler", "--lengths", "512", "--n", "1")
    fit = [task for task in expand(["ruler"]) if task != "cwe"]
    assert code == 2 and "\n" not in err, err
    assert "task 'cwe' at length 512: length 512 is too short" in err
    assert err.endswith(f"; leave out cwe: --tasks {','.join(fit)} fit every length given"), err


@pytest.mark.parametrize("command", ["model-eval", "compare"])
@pytest.mark.parametrize("tasks, said", [("niah_single_1,niah_single_1", "niah_single_1 is named twice"),
                                         ("vt,niah_single_1,vt", "vt is named twice"),
                                         ("niah,niah_single_1", "niah_single_1 is named by 'niah' and by "
                                                                "'niah_single_1'")])
def test_a_task_named_twice_is_refused(command, tasks, said, model_dir, tmp_path, capsys, no_model_load):
    """As a length given twice: the task would be answered and reported twice, or one naming dropped silently
    (a group and one of its tasks)."""
    out = ["--rows", tmp_path / "rows.jsonl"] if command == "model-eval" else ["--out", tmp_path / "out"]
    lengths = ["--lengths", "512"] if command == "model-eval" else ["--length", "512"]
    code, err = run_cli(capsys, command, "--model", model_dir, "--tasks", tasks, *lengths, "--n", "1", *out)
    assert code == 2 and "\n" not in err and f"--tasks {tasks}: {said}; name each task once" in err, err


def test_fetch_model_gguf_that_is_a_directory_names_the_file_to_give(tmp_path, capsys):
    code, err = run_cli(capsys, "fetch-model", "smollm2-135m-instruct", "--gguf", tmp_path,
                        "--cache", tmp_path / "cache")
    assert code == 2 and "\n" not in err
    assert f"--gguf {tmp_path} is a directory; give the GGUF file itself, e.g. {tmp_path}/SmolLM2-135M-Instruct" in err
    code, err = run_cli(capsys, "fetch-model", "smollm2-135m-hybrid", "--gguf", tmp_path,
                        "--cache", tmp_path / "cache")
    assert code == 2 and "SmolLM2-135M-Instruct.Q4_1.gguf" in err  # the hybrid's teacher's file
    assert not (tmp_path / "cache").exists()


def test_verify_docs_that_is_a_file_is_not_offered_as_a_place_to_write(tmp_path, capsys):
    import shutil
    from pathlib import Path

    store = tmp_path / "store"
    shutil.copytree(Path(__file__).resolve().parents[2] / "docs" / "results", store)
    docs = tmp_path / "leaderboard.md"
    docs.write_text("mine\n")
    code, err = run_cli(capsys, "verify", store, "--docs", docs)
    assert code == 2 and "\n" not in err and f"--docs {docs} is a file" in err and "writes it" not in err
    assert docs.read_text() == "mine\n"


def test_verify_names_a_bad_docs_before_it_reads_a_store(tmp_path, capsys, monkeypatch):
    """Probe 63: the whole store was verified first ("… rows complete"), then --docs refused."""
    import bench.reports.verify

    monkeypatch.setattr(bench.reports.verify, "open_stores", lambda stores: pytest.fail("the stores were read first"))
    code, err = run_cli(capsys, "verify", tmp_path / "store", "--docs", tmp_path / "none")
    assert code == 2 and f"--docs {tmp_path / 'none'}: no such directory" in err, err


def test_model_eval_takes_the_groups_of_generated_tasks(model_dir, capsys, monkeypatch):
    """``--tasks niah`` is every needle task (as bench compare reads it); a group of tasks model-eval cannot generate
    (scbench) is named with what it takes."""
    import runtime

    monkeypatch.setattr(runtime.Parent, "answer", lambda *a, **k: pytest.fail("answered before the refusal"))
    code, err = run_cli(capsys, "model-eval", "--model", model_dir, "--tasks", "niah", "--lengths", "100", "--n", "1")
    assert code == 2 and "task 'niah_single_1' at length 100: length 100 is too short" in err, err
    code, err = run_cli(capsys, "model-eval", "--model", model_dir, "--tasks", "scbench", "--n", "1")
    assert code == 2 and "--tasks 'scbench': model-eval answers the generated tasks niah_single_1" in err, err
    assert "(or the groups ruler, niah, haystack)" in err


def test_a_flag_the_command_does_not_take_is_named_by_the_command(model_dir, capsys, no_model_load):
    """``bench compare --replace``: the command's own line and --help (argparse named the top-level ``bench``,
    whose --help lists no command's flags)."""
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--replace")
    assert code == 2 and err.startswith("bench compare: error: unrecognized arguments: --replace (`bench compare "
                                        "--help` lists the flags)"), err


def test_a_press_that_cannot_run_on_the_model_is_refused_before_the_progress_bar(model_dir, tmp_path, capsys):
    """Checked once the model is loaded (what the press reads of it), before any fork is counted."""
    code = main(["compare", "--model", str(model_dir), "--press", "kvpress:ExpectedAttentionPress", "--tasks",
                 "niah_single_1", "--n", "1", "--length", "256", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("bench compare: error: press 'kvpress:ExpectedAttentionPress' cannot run "), err
    assert "(partial RoPE)" in err and err.count("\n") <= 1 and "fork" not in err, err
    assert not (tmp_path / "out" / "results.jsonl").exists()


def test_labels_that_name_a_file_ask_for_the_folder(model_dir, tmp_path, capsys, no_model_load):
    """The advice is a command that runs: `bench label --out FILE` would be refused."""
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "results.jsonl").write_text("{}\n")
    for command in ("train", "analyze"):
        code = main([command, "--model", str(model_dir), "--labels", str(tmp_path / "labels" / "results.jsonl"),
                     "--out", str(tmp_path / command)])
        err = capsys.readouterr().err
        assert code == 2 and f"--labels: {tmp_path / 'labels' / 'results.jsonl'} is a file: give the folder of " \
            f"label shards that `bench label --out` wrote (here perhaps {tmp_path / 'labels'})" in err, err
    # before what the command would write: a model holding an estimator would have asked for --replace first
    model = copy_model(model_dir, tmp_path / "with-estimator")
    (model / "gatesight").mkdir(exist_ok=True)
    (model / "gatesight" / "gatesight.safetensors").write_bytes(b"kept")
    code = main(["train", "--model", str(model), "--labels", str(tmp_path / "labels" / "results.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and "is a file: give the folder of label shards" in err and "--replace" not in err, err


@pytest.mark.parametrize("model", ["", "  "])
def test_an_empty_model_is_named_in_the_library_too(tmp_path, model):
    with pytest.raises(ValueError, match=f"model {model!r} is empty: give a model directory, a hub id or a "
                                         "catalogued name"):
        run_compare(compare_settings(model, tmp_path / "out"), show_progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("stop, code, how", [(KeyboardInterrupt, 130, "interrupted"), ("terminated", 143,
                                                                                      "terminated")])
def test_a_stop_while_the_bench_loads_is_one_line(monkeypatch, capsys, stop, code, how):
    """Ctrl-C or SIGTERM while `bench` imports its modules (seconds: torch, transformers) ends it with one line and
    its exit code, as during a command; the console script's module loads nothing heavy, so it is in place first."""
    import subprocess
    import sys
    import types

    from bench import entry
    from bench.run import stopping

    stop = stopping.Terminated if stop == "terminated" else stop

    def loading(name):
        raise stop

    fake = types.ModuleType("bench.commands.cli")
    fake.__getattr__ = loading
    monkeypatch.setitem(sys.modules, "bench.commands.cli", fake)
    assert entry.main() == code
    err = capsys.readouterr().err.strip()
    assert err == f"bench: {how}; it stopped while starting, before any work: nothing was written", err
    light = subprocess.run([sys.executable, "-c", "import sys, bench.entry; print(sorted({'torch', 'transformers', "
                            "'numpy', 'bench.commands.cli'} & set(sys.modules)))"], capture_output=True,
                           text=True, check=True)
    assert light.stdout.strip() == "[]"


def test_the_console_script_is_the_entry_module():
    from importlib.metadata import entry_points

    assert [e.value for e in entry_points(group="console_scripts") if e.name == "bench"] == ["bench.entry:main"]


def test_a_stop_after_the_command_is_done_changes_nothing(monkeypatch):
    """Probe 71: a signal in the ~0.3 s of shutdown after the last line gave exit 130 or 143 with no line to say
    why; once the command returns, the console script ignores stops (the work is done and said)."""
    import signal
    import types

    from bench import entry

    monkeypatch.setitem(__import__("sys").modules, "bench.commands.cli", types.SimpleNamespace(main=lambda: 0))
    previous = {stop: signal.getsignal(stop) for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        assert entry.main() == 0
        assert all(signal.getsignal(stop) is signal.SIG_IGN for stop in previous)
        signal.raise_signal(signal.SIGINT)  # ignored: no KeyboardInterrupt
    finally:
        for stop, handler in previous.items():
            signal.signal(stop, handler)


def test_a_hang_up_is_a_stop_with_its_own_code(capsys):
    """Probe 73: SIGHUP (a closed terminal) was no stop: a train or leaderboard cut between its renames."""
    import signal

    from bench.run.stopping import HungUp, StopOnSignals, stopped

    with pytest.raises(HungUp), StopOnSignals():
        signal.raise_signal(signal.SIGHUP)
    assert stopped(HungUp(), "bench train", "nothing was written") == 129
    assert capsys.readouterr().err.strip() == "bench train: hung up; nothing was written"

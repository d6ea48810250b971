"""What a library caller hands ``run_compare`` in the wrong type is one clear error naming the field, before any
model loads; a run of very many contexts starts at once, its contexts read from their positions as the full list
(:func:`bench.store.row_fields.shard_contexts`) has them."""

import json

import numpy as np
import pytest

import bench.run.compare as compare
from bench.run.compare import contexts_of, execute, plan, run_compare
from bench.store.row_fields import shard_contexts
from runtime.errors import UsageError
from tests.helpers import compare_settings, run_cli


@pytest.mark.parametrize("change, message", [
    ({"n": 1.5}, "n must be an integer, got 1.5 (float)"),
    ({"n": True}, "n must be an integer, got True (bool)"),
    ({"length": "384"}, "length must be an integer, got '384' (str)"),
    ({"seed": 0.0}, "seed must be an integer, got 0.0 (float)"),
    ({"keep_fractions": [0.5, "0.1"]}, "keep_fractions must hold numbers in (0, 1], got '0.1' in [0.5, '0.1']"),
    ({"keep_fractions": 0.5}, "keep_fractions must be a list of numbers, e.g. [0.5], got 0.5"),
    ({"presses": "snapkv"}, "presses must be a list of names, e.g. ['snapkv'], got 'snapkv'"),
    ({"tasks": "niah_single_1"}, "tasks must be a list of names, e.g. ['niah_single_1'], got 'niah_single_1'"),
    ({"allocators": "flat"}, "allocators must be a list of names, e.g. ['flat'], got 'flat'"),
    ({"pairs": "snapkv/flat"}, "pairs must be a list of names, e.g. ['snapkv/flat'], got 'snapkv/flat'"),
])
def test_a_field_of_the_wrong_type_is_named(model_dir, tmp_path, no_model_load, change, message):
    with pytest.raises(UsageError) as error:
        run_compare(compare_settings(model_dir, tmp_path / "out", **change), show_progress=False)
    assert str(error.value) == message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("tasks, n, shards", [
    (["niah_single_1"], 5, 1), (["niah_single_1", "niah_single_2", "vt"], 4, 3), (["a", "b"], 3, 7),
    (["a", "b", "c"], 1, 2)])
def test_contexts_are_the_shard_list_of_the_run(tasks, n, shards):
    for k in range(shards):
        run = {"tasks": tasks, "n": n, "haystack": "generated", "shard": k, "shards": shards}
        expected = [(task, item) for task in tasks for item in range(n)][k::shards]
        contexts = shard_contexts(run)
        assert list(contexts) == expected and len(contexts) == len(expected) and bool(contexts) == bool(expected)
        others = [(t, i) for t in tasks + ["other"] for i in range(-1, n + 1)]
        assert [c for c in others if c in contexts] == [c for c in others if c in expected]


def test_a_run_of_very_many_contexts_starts_at_once(model_dir, tmp_path, monkeypatch):
    """``--n 100000000``: the first context is answered with the progress total of every fork, no list built."""
    seen = {}

    def first_job(harness, jobs, is_done, emit):
        seen["first"], seen["count"] = (jobs[0].task, jobs[0].index, jobs[0].done), len(jobs)
        raise KeyboardInterrupt

    monkeypatch.setattr(compare, "in_this_process", first_job)
    run = plan(compare_settings(model_dir, tmp_path / "out", n=10**8, tasks=["niah_single_1", "niah_single_2"]))
    with pytest.raises(KeyboardInterrupt):
        execute(run, show_progress=False)
    assert seen == {"first": ("niah_single_1", 0, frozenset()), "count": 2 * 10**8}
    assert contexts_of(run)[-1] == ("niah_single_2", 10**8 - 1)


@pytest.mark.parametrize("option", ["--press=gatesight[estimator={missing}]", "--press-options=estimator={missing}"])
def test_a_cli_estimator_directory_without_one_is_named(model_dir, tmp_path, capsys, no_model_load, option):
    missing = tmp_path / "nowhere"
    code, err = run_cli(capsys, "compare", "--model", model_dir, *option.format(missing=missing).split("=", 1),
                        "--alloc", "flat", "--out", tmp_path / "out")
    assert code == 2 and f"estimator={str(missing)!r}: no such directory" in err, err


@pytest.mark.parametrize("change, message", [
    ({"press_options": "window=64"}, "press_options must be a dict of option values by name, e.g. {'window': 64}, "
                                     "got 'window=64'"),
    ({"press_options": [("window", 64)]}, "press_options must be a dict of option values by name, e.g. "
                                          "{'window': 64}, got [('window', 64)]"),
    ({"alloc_options": "weights=1/2"}, "alloc_options must be a dict of option values by name, e.g. "
                                       "{'weights': [1, 2]}, got 'weights=1/2'"),
])
def test_options_that_are_not_a_dict_are_named(model_dir, tmp_path, no_model_load, change, message):
    with pytest.raises(UsageError) as error:
        run_compare(compare_settings(model_dir, tmp_path / "out", **change), show_progress=False)
    assert str(error.value) == message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fraction", [np.float32(0.5), np.float64(0.5)])
def test_numpy_kept_fractions_are_written_as_plain_floats(model_dir, tmp_path, fraction):
    run = plan(compare_settings(model_dir, tmp_path / "out", keep_fractions=[fraction]))
    assert run.keep_fractions == (0.5,) and type(run.keep_fractions[0]) is float
    rows = run_compare(run, show_progress=False).rows
    compacted = [row for row in rows if row["press"] != "none"]
    assert compacted and {row["keep_fraction"] for row in compacted} == {0.5}
    assert all(type(row["keep_fraction"]) is float for row in rows)


@pytest.mark.parametrize("change, message", [
    ({"presses": ["keydiff", 3]}, "presses must hold names (text), e.g. ['snapkv'], got 3 in ['keydiff', 3]"),
    ({"allocators": [None]}, "allocators must hold names (text), e.g. ['flat'], got None in [None]"),
    ({"tasks": ["niah_single_1", 1]}, "tasks must hold names (text), e.g. ['niah_single_1'], got 1 in "
                                      "['niah_single_1', 1]"),
    ({"pairs": ["keydiff/flat", ("snapkv", "flat")]}, "pairs must hold names (text), e.g. ['snapkv/flat'], got "
                                                      "('snapkv', 'flat') in ['keydiff/flat', ('snapkv', 'flat')]"),
    ({"seed": -1}, "seed must be an integer >= 0, got -1"),
    ({"model": 3}, "model must be a model directory or hub id (str or Path), a pretrained.loading.ModelSpec, a "
                   "pretrained.model_info.ModelInfo or None (the shipped model), got int 3"),
    ({"shard": "0/2"}, "shard must be a (k, n) tuple of integers with 0 <= k < n, e.g. (0, 2), got '0/2'"),
    ({"shard": (0, 1, 2)}, "shard must be a (k, n) tuple of integers with 0 <= k < n, e.g. (0, 2), got (0, 1, 2)"),
    ({"shard": (0.0, 2)}, "shard must be a (k, n) tuple of integers with 0 <= k < n, e.g. (0, 2), got (0.0, 2)"),
    ({"shard": (True, 2)}, "shard must be a (k, n) tuple of integers with 0 <= k < n, e.g. (0, 2), got (True, 2)"),
    ({"shard": (2, 2)}, "shard must be a (k, n) tuple of integers with 0 <= k < n, e.g. (0, 2), got (2, 2)"),
    ({"shard": (-1, 2)}, "shard must be a (k, n) tuple of integers with 0 <= k < n, e.g. (0, 2), got (-1, 2)"),
    ({"out": None}, "out must be a directory path (str or Path), got NoneType None"),
    ({"out": 3}, "out must be a directory path (str or Path), got int 3"),
    ({"out": ""}, "out='' is empty ('' would mean the current folder): give the directory the results go to"),
    ({"out": " "}, "out=' ' is empty ('' would mean the current folder): give the directory the results go to"),
    ({"press_options": {3: 4}}, "press_options must name each option by text, e.g. {'window': 64}, got the key 3"),
    ({"scbench_data": 3}, "scbench_data must be a directory path (str or Path) or None, got int 3"),
    ({"out": "/proc/xx"}, "out /proc/xx: /proc holds the kernel's virtual files, not results; give a directory on "
                          "disk"),
    ({"tasks": ["scbench_kv"], "scbench_data": __file__}, f"--scbench-data {__file__}: is a file, not a folder (give "
                                                          "the folder of a local copy of microsoft/SCBench: its "
                                                          "scbench_<task>.jsonl files or a datasets cache)"),
])
def test_a_field_of_the_wrong_kind_or_range_is_named_before_the_model(model_dir, tmp_path, no_model_load, change,
                                                                      message):
    settings = compare_settings(model_dir, tmp_path / "out")
    for name, value in change.items():
        setattr(settings, name, value)
    with pytest.raises(UsageError) as error:
        run_compare(settings, show_progress=False)
    assert str(error.value) == message
    assert not (tmp_path / "out").exists()


def test_numpy_integers_are_planned_and_written_as_plain_ints(model_dir, tmp_path):
    numpy = {"n": np.int64(1), "length": np.int32(300), "seed": np.int64(3), "shard": (np.int64(0), np.int64(1)),
             "batch": np.int64(2), "jobs": np.int64(1)}
    run = plan(compare_settings(model_dir, tmp_path / "out", **numpy))
    planned = {"n": run.n, "length": run.length, "seed": run.seed, "shard": run.shard, "batch": run.batch,
               "jobs": run.jobs}
    assert planned == {"n": 1, "length": 300, "seed": 3, "shard": (0, 1), "batch": 2, "jobs": 1}
    assert all(type(value) is int for value in (run.n, run.length, run.seed, *run.shard, run.batch, run.jobs))
    rows = run_compare(run, show_progress=False).rows
    written = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert rows and len(written) == len(rows)
    assert {(row["length"], row["seed"], row["item"]) for row in written} == {(300, 3, 0)}


def test_a_model_that_is_a_file_is_one_usage_error(model_dir, tmp_path):
    """A path to a file where a model directory belongs: a UsageError (also a FileNotFoundError) naming it."""
    from runtime.errors import MissingFileError

    afile = tmp_path / "model.bin"
    afile.write_text("not a model")
    with pytest.raises(MissingFileError, match=f"no model at {afile}: expected a local HF model directory"):
        run_compare(compare_settings(model_dir, tmp_path / "out", model=str(afile)), show_progress=False)
    assert issubclass(MissingFileError, UsageError) and issubclass(MissingFileError, FileNotFoundError)


@pytest.mark.parametrize("press, option", [("gatesight", "estimator"), ("triattention", "calibration")])
def test_an_empty_directory_option_is_named_as_empty(model_dir, tmp_path, capsys, no_model_load, press, option):
    """``gatesight[estimator=]`` was reported as ``estimator='.'`` (the current directory)."""
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--out", tmp_path / "out", "--press",
                        f"{press}[{option}=]")
    assert code == 2 and f"{option}='' is empty" in err and "'.'" not in err, err


def test_merge_stores_refuses_bytes_for_its_sources(tmp_path):
    """Bytes are a sequence of numbers: iterated, each would be read as a store."""
    from bench.store.merge import merge_stores

    with pytest.raises(UsageError, match=r"^sources=b'/tmp/x' are bytes: give a list of store directories"):
        merge_stores(b"/tmp/x", tmp_path / "out")
    assert not (tmp_path / "out").exists()

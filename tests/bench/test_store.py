"""The result store and what reads it: the code version a row carries covers the code that makes it, one writer at
a time, lines that are not rows refused by file and line, stores of older schemas read or refused, ``bench verify``'s
checks of every row, damaged stores named, and a full or read-only disk one clear error after which a rerun
resumes."""

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import bench.store.project_modules
from bench.run.compare import run_compare, run_rows
from bench.store.code_version import _normalised_source, code_version, result_modules
from bench.store.result_store import ResultStore
from runtime.errors import UsageError
from tests.helpers import compare_settings, published_stores, run_cli


def test_code_version_ignores_comments_and_docstrings(tmp_path):
    a, b, c = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    a.write_text('def f(x):\n    return x + 1\n')
    b.write_text('"""Module doc."""\n\n\ndef f(x):  # a comment\n    """Doc."""\n    # why\n    return x + 1\n')
    c.write_text('def f(x):\n    return x + 2\n')
    assert _normalised_source(a) == _normalised_source(b) != _normalised_source(c)
    hf = result_modules("hf")
    assert not any(m in hf for m in ("bench.reports.report", "bench.commands.cli", "bench.store.result_store",
                                     "bench.reports.leaderboard", "artifacts.files", "artifacts.output_kinds",
                                     "artifacts.outputs"))
    # the CLI's wording and help never decide a value: an edit of them must not strand a store's unfinished run
    assert not [m for m in hf if m == "bench.commands.arguments" or m.endswith("_command") or m == "bench.store.merge"]
    assert {"runtime.session", "presses.selection", "allocators.base", "bench.run.rows"} <= set(hf)
    # a method's own code is its own (bench.store.code_version.method_codes): not the group's
    assert not {"presses.keydiff", "allocators.flat", "presses.registry"} & set(hf)
    assert not any(m.startswith("serving") for m in hf) and "serving.worker" in result_modules("vllm")


@pytest.mark.slow  # ~4 s: it copies and hashes the sources; CI's slow run holds it
def test_code_version_follows_what_each_engines_rows_import(tmp_path, monkeypatch):
    """A serving-only edit keeps the hf engine's code version (and changes vLLM's); a runtime edit changes both."""
    for package in ("runtime", "presses", "allocators", "workloads", "artifacts", "bench", "serving", "pretrained"):
        for path in (bench.store.project_modules.ROOT / package).rglob("*.py"):
            target = tmp_path / path.relative_to(bench.store.project_modules.ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(path.read_text())
    monkeypatch.setattr(bench.store.project_modules, "ROOT", tmp_path)
    hf, vllm = code_version("hf"), code_version("vllm")
    assert hf != vllm
    with (tmp_path / "serving" / "worker.py").open("a") as f:
        f.write("\nSERVING_ONLY_CHANGE = 1\n")
    assert code_version("hf") == hf and code_version("vllm") != vllm
    vllm = code_version("vllm")
    with (tmp_path / "runtime" / "kv.py").open("a") as f:
        f.write("\nRUNTIME_CHANGE = 1\n")
    assert code_version("hf") != hf and code_version("vllm") != vllm


@pytest.mark.slow  # ~4 s: two runs; CI's slow run holds it
def test_a_run_summarises_only_its_own_settings(model_dir, tmp_path):
    first = run_compare(compare_settings(model_dir, tmp_path), show_progress=False)
    run_compare(compare_settings(model_dir, tmp_path, length=400), show_progress=False)
    store = ResultStore(tmp_path, readonly=True)
    assert {r["length"] for r in store.rows} == {300, 400}
    own = run_rows(store, compare_settings(model_dir, tmp_path))
    assert {r["length"] for r in own} == {300} and len(own) == len(first.rows)


@contextmanager
def held_by_a_writer(directory: Path) -> Iterator[int]:
    """While the context lasts, another process (its pid given) holds the store in ``directory`` as its writer."""
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from bench.store.result_store import ResultStore
        store = ResultStore({str(directory)!r})
        print("locked", flush=True)
        time.sleep(30)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield holder.pid
    finally:
        holder.kill()
        holder.wait()


def test_a_second_writer_is_refused_at_once(tmp_path):
    with held_by_a_writer(tmp_path) as pid:
        with pytest.raises(ValueError, match=f"being written by another process \\(pid {pid}\\)"):
            ResultStore(tmp_path)
    ResultStore(tmp_path).close()  # the lock died with its process


def test_a_writer_starting_while_verify_asks_about_the_store_is_not_refused(tmp_path):
    """``lock_holder`` (verify asking whether a store is being written) holds a shared lock for an instant; a
    writer starting in that instant waits it out instead of being refused as if a run held the store."""
    import fcntl
    import threading

    ResultStore(tmp_path).close()
    (tmp_path / ".lock").touch()
    with (tmp_path / ".lock").open("r") as probe:
        fcntl.flock(probe, fcntl.LOCK_SH)
        threading.Timer(0.2, fcntl.flock, (probe, fcntl.LOCK_UN)).start()
        store = ResultStore(tmp_path)  # refused before: the probe's lock was taken for a writer's
    assert (tmp_path / ".lock").read_text() == str(os.getpid())
    store.close()


def test_a_writer_leaves_no_lock_file_and_no_empty_directory_of_its_own(tmp_path):
    fresh = tmp_path / "fresh"
    ResultStore(fresh).close()  # a run refused before its first row: nothing of it is left
    assert not fresh.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    ResultStore(kept).close()  # the user's own directory stays
    assert kept.is_dir() and not any(kept.iterdir())
    store = ResultStore(kept)
    assert (kept / ".lock").read_text() == str(os.getpid())
    store.close()
    assert not (kept / ".lock").exists()


def test_a_lock_on_a_removed_lock_file_is_not_taken(tmp_path, monkeypatch):
    """The holder removes ``.lock`` before it unlocks; a writer that opened the old file and then locked it holds a
    lock on nothing and must take the new file's."""
    import fcntl

    real_flock, opened = fcntl.flock, []

    def flock_after_the_holder_left(handle, flags):
        if not opened:  # the first lock: the file is removed under it, as a closing holder does
            opened.append(handle)
            (tmp_path / ".lock").unlink()
        return real_flock(handle, flags)

    monkeypatch.setattr(fcntl, "flock", flock_after_the_holder_left)
    store = ResultStore(tmp_path)
    assert os.stat(tmp_path / ".lock").st_ino == os.fstat(store._lock.fileno()).st_ino
    store.close()


def test_lines_that_are_not_rows_are_refused_by_file_and_line(model_dir, tmp_path, capsys):
    """Probe 64: a row lacking ``task`` or a line that is no JSON was skipped with a warning, and verify, merge and
    publish carried on without it; a row lacking ``kl`` was refused. One rule: a line that is no row is refused by
    every check, named by file and line (a last line cut short by a kill is a resume's to drop)."""
    run_compare(compare_settings(model_dir, tmp_path), show_progress=False)
    path = tmp_path / "results.jsonl"
    good = path.read_bytes()
    rows = good.count(b"\n")
    no_task = json.loads(good.splitlines()[0])
    del no_task["task"]
    path.write_bytes(good + b"42\n\xff\xfe not utf-8\n" + json.dumps(no_task).encode() + b"\n")
    damaged = path.read_bytes()
    with pytest.raises(UsageError, match=f"3 row\\(s\\) are not valid results: {re.escape(str(path))}:{rows + 1}: "
                                         "not a row .*:" f"{rows + 3}: not a row: it lacks task"):
        run_compare(compare_settings(model_dir, tmp_path), show_progress=False)
    assert path.read_bytes() == damaged  # nothing rewritten
    for argv in (["verify", tmp_path], ["merge", tmp_path, "--out", tmp_path / "m"],
                 ["publish", tmp_path, "--into", tmp_path / "c"]):
        code, err = run_cli(capsys, *argv)
        assert code == 2 and f"{path}:{rows + 2}: not a row" in err, (argv, err)
    assert not (tmp_path / "m").exists() and not (tmp_path / "c").exists()


def test_a_store_from_before_the_fidelity_metrics_is_refused(model_dir, tmp_path):
    old = {"model": "m", "press": "none", "allocator": "none", "ratio": 1.0, "task": "vt", "item": 0, "score": 1.0}
    (tmp_path / "results.jsonl").write_text(json.dumps(old) + "\n")
    before = (tmp_path / "results.jsonl").read_bytes()
    with pytest.raises(ValueError, match="1 row\\(s\\) written before the fidelity metrics"):
        run_compare(compare_settings(model_dir, tmp_path), show_progress=False)
    assert (tmp_path / "results.jsonl").read_bytes() == before


def test_rows_stored_under_old_names_are_read_under_todays():
    """The committed stores are never rewritten: a field renamed since is read under today's name (``ratio`` was the
    kept fraction p, a word that elsewhere names the evicted fraction; ``gdn_bytes`` held the recurrent state of
    Mamba2 layers too), and nothing else of a row changes."""
    import gzip

    renamed = {"ratio": "keep_fraction", "gdn_bytes": "recurrent_bytes"}
    directory = Path(__file__).resolve().parents[2] / "docs" / "realtext" / "before"  # written before both renames
    raw = [json.loads(line) for line in gzip.decompress((directory / "results.jsonl.gz").read_bytes()).splitlines()]
    assert raw and all(set(renamed) <= set(r) and not set(renamed.values()) & set(r) for r in raw)
    rows = ResultStore(directory, readonly=True).rows
    assert rows == [{renamed.get(field, field): value for field, value in r.items()} for r in raw]


def test_rows_from_before_the_engine_field_read_as_the_runtimes(tmp_path):
    row = {"schema": 2, "model": "m", "weights": "w", "press": "none", "allocator": "none", "keep_fraction": 1.0,
           "task": "vt", "profile": "compact", "length": 512, "item": 0, "question": 0, "seed": 0,
           "code": "c0dec0dec0de"}
    (tmp_path / "results.jsonl").write_text(json.dumps(row) + "\n")
    (stored,) = ResultStore(tmp_path, readonly=True).rows
    assert stored["engine"] == "hf"


@pytest.mark.slow  # it reads the whole collection (17 s); CI also runs bench verify docs/results --docs docs
def test_the_committed_store_still_reads_and_verifies():
    from bench.reports.report import group_rows, group_title
    from bench.store.project_modules import ROOT

    stores = published_stores()
    rows = [row for store in stores for row in store.rows]
    assert rows and all(store.problems() == [] for store in stores)
    assert {(r["dtype"], r["device"], r["engine"]) for r in rows} == {("float32", "cpu", "hf")}
    titles = [group_title(key) for key in group_rows(rows)]
    published = (ROOT / "docs" / "leaderboard.md").read_text()
    # the shipped model at 2,048 and 4,096 tokens; the real pretrained model at 2,048; the GateSight issue's group
    # on the hybrid (its own estimator artifacts) at 2,048 and 4,096
    assert {r["length"] for r in rows} == {2048, 4096} and len(titles) == 5
    assert {r["model"] for r in rows} == {"hybrid-byte-12l", "smollm2-135m-instruct", "smollm2-135m-hybrid"}
    assert all("dtype" not in title and title in published for title in titles)


GOOD_ROW = {"schema": 2, "model": "m", "weights": "w", "artifacts": "a", "press": "none", "allocator": "none",
            "keep_fraction": 1.0, "task": "vt", "profile": "compact", "length": 512, "item": 0, "question": 0,
            "seed": 0, "code": "c0dec0dec0de", "engine": "hf", "dtype": "float32", "device": "cpu", "score": 1.0,
            "answer_nll": 0.5, "delta_nll": 0.0, "kl": 0.0, "agree": True}


@pytest.mark.parametrize("change, message", [
    ({"kl": -1.0}, "kl=-1.0 (expected a finite number in [-1e-06, 1e+06] nats: a mean KL divergence"),
    ({"score": float("nan")}, "score=nan (expected a number in [0, 1])"),
    ({"score": 1.5}, "score=1.5 (expected a number in [0, 1])"),
    ({"delta_nll": "abc"}, "delta_nll='abc' (expected a finite number in [-1e+06"),
    ({"agree": "yes"}, "agree='yes' (expected true or false)"),
    ({"kl": float("inf")}, "kl=inf"),
])
def test_verify_and_the_leaderboard_refuse_impossible_rows(tmp_path, capsys, change, message):
    compacted = {**GOOD_ROW, "press": "keydiff", "allocator": "flat", "keep_fraction": 0.5, "delta_nll": 0.3, "kl": 0.1,
                 "agree": False, "answer_nll": GOOD_ROW["answer_nll"] + 0.3}
    lines = [GOOD_ROW, compacted, {**compacted, "item": 1, **change}]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in lines))
    for argv in (["verify", tmp_path], ["leaderboard", tmp_path, "--out", tmp_path / "docs"]):
        code, err = run_cli(capsys, *argv)
        assert code == 2 and "1 row(s) are not valid results" in err, err
        assert f"{tmp_path / 'results.jsonl'}:3: {message}" in err
    assert not (tmp_path / "docs" / "leaderboard.md").exists()


def test_verify_refuses_a_no_prune_row_that_changed(tmp_path, capsys):
    (tmp_path / "results.jsonl").write_text(json.dumps({**GOOD_ROW, "delta_nll": 0.2}) + "\n")
    code, err = run_cli(capsys, "verify", tmp_path)
    assert code == 2 and f"{tmp_path / 'results.jsonl'}:1: the no-prune row has delta_nll=0.2" in err


@pytest.mark.parametrize("make, message", [
    (lambda d: (d / "results.jsonl.gz").write_bytes(b"not gzip at all"), "results.jsonl.gz: not a complete gzip file"),
    (lambda d: (d / "results.jsonl.gz").write_bytes(__import__("gzip").compress(b'{"a": 1}\n' * 100)[:30]),
     "results.jsonl.gz: not a complete gzip file"),
    (lambda d: (d / "results.jsonl").mkdir(), "results.jsonl: a folder, where a result store's file belongs"),
])
def test_a_damaged_store_is_named(tmp_path, capsys, make, message):
    make(tmp_path)
    for argv in (["verify", tmp_path], ["leaderboard", tmp_path, "--out", tmp_path / "docs"]):
        code, err = run_cli(capsys, *argv)
        assert code == 2 and message in err, err


@pytest.mark.slow  # ~6 s: a run and its resume; CI's slow run holds it
def test_a_full_disk_is_one_error_and_a_rerun_resumes(model_dir, tmp_path, capsys, monkeypatch):
    import errno

    out = tmp_path / "out"
    argv = ["compare", "--model", model_dir, "--out", out, "--press", "keydiff", "--keep-fractions", "0.5,0.2",
            "--tasks", "niah_single_1", "--n", "1", "--length", "300"]
    real_append = ResultStore.append

    def full_after_one(store, row):
        if len(store.rows) >= 1:
            raise OSError(errno.ENOSPC, "No space left on device", str(store.path))
        real_append(store, row)

    monkeypatch.setattr(ResultStore, "append", full_after_one)
    code, err = run_cli(capsys, *argv)
    assert code == 2 and f"{out / 'results.jsonl'}: No space left on device" in err
    def full_unnamed(store, row):  # a write to an open file names no file: the --out is named (probe 64)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ResultStore, "append", full_unnamed)
    code, err = run_cli(capsys, *argv)
    assert code == 2 and f"{out}: No space left on device; what was finished is kept" in err, err
    monkeypatch.setattr(ResultStore, "append", real_append)
    assert run_cli(capsys, *argv)[0] == 0
    rows = ResultStore(out, readonly=True).rows
    assert len(rows) == 3 and len({json.dumps(r, sort_keys=True) for r in rows}) == 3
    summary = (out / "summary.md").read_text()
    assert summary.startswith("## ")
    real_write = Path.write_text

    def full_half_way(path, text, *args, **kwargs):  # the disk fills while the summary is written
        if "summary.md" not in path.name:
            return real_write(path, text, *args, **kwargs)
        real_write(path, text[:10])
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(Path, "write_text", full_half_way)
    code, err = run_cli(capsys, *argv)
    monkeypatch.undo()
    assert code == 2 and "No space left on device" in err
    assert (out / "summary.md").read_text() == summary and sorted(p.name for p in out.iterdir()) == [
        ".curves.png.sha256", ".summary.md.sha256", "curves.png", "results.jsonl", "summary.md"]  # the records of
    # the summary and curves it wrote


def test_a_read_only_leaderboard_out_is_one_error(tmp_path, capsys, monkeypatch):
    from artifacts import files

    (tmp_path / "results.jsonl").write_text(json.dumps(GOOD_ROW) + "\n")

    def read_only(*args, dir=None, **kwargs):
        raise PermissionError(13, "Permission denied", str(dir))

    monkeypatch.setattr(files.tempfile, "mkstemp", read_only)
    code, err = run_cli(capsys, "leaderboard", tmp_path, "--out", tmp_path / "docs")
    assert code == 2 and f"{tmp_path / 'docs'}/.leaderboard-build-" in err and ": Permission denied" in err, err


@pytest.mark.parametrize("name", ["results.jsonl", "results.jsonl.gz"])
@pytest.mark.parametrize("readonly", [True, False])
def test_a_store_file_that_is_a_pipe_is_refused_not_read(tmp_path, name, readonly):
    """Probe 67: a pipe in a store file's place hung verify and compare (reading it waits for a writer)."""
    os.mkfifo(tmp_path / name)
    with pytest.raises(UsageError, match=f"{re.escape(name)}: not a regular file, where a result store.s file belongs"):
        ResultStore(tmp_path, readonly=readonly)

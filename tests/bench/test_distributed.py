"""Past one machine: shards of a run merged = the run in one process; Ray actors give the rows one process gives."""

import contextlib
import importlib.util
import json

import pytest
import torch

from bench.run.compare import run_compare
from bench.store.merge import merge_stores
from tests.helpers import compare_settings

pytestmark = pytest.mark.slow  # process-heavy: run by .ci/run beside the default run (-m slow)

TIMINGS = ("prefill_seconds", "score_seconds")


def _settings(model_dir, out, **change):
    """Two allocators at p = 0.3, two tasks of two contexts each, 384 tokens: several jobs to share out."""
    return compare_settings(model_dir, out, **{**DISTRIBUTED, **change})


DISTRIBUTED = dict(allocators=["flat", "pyramid"], keep_fractions=[0.3], tasks=["niah_single_1", "vt"], n=2, length=384)


def _rows(directory):
    """The store's rows in a stable order, without their timings, and of their run without its shard (the shards
    of a run differ in that alone)."""
    rows = [json.loads(line) for line in (directory / "results.jsonl").read_text().splitlines()]
    key = lambda r: (r["task"], r["item"], r["question"], r["press"], r["allocator"])  # noqa: E731
    return sorted(({**{k: v for k, v in r.items() if k not in TIMINGS},
                    "run": {k: v for k, v in r["run"].items() if k not in ("shard", "shards")}} for r in rows), key=key)


def test_shards_merged_equal_the_whole_run(model_dir, tmp_path):
    run_compare(_settings(model_dir, tmp_path / "whole"), show_progress=False)
    for k in range(3):
        run_compare(_settings(model_dir, tmp_path / f"shard{k}", shard=(k, 3)), show_progress=False)
    shard_rows = [_rows(tmp_path / f"shard{k}") for k in range(3)]
    assert all(shard_rows) and len({(r["task"], r["item"]) for r in shard_rows[0]}) == 2  # positions 0 and 3
    assert (merge_stores([tmp_path / f"shard{k}" for k in range(3)], tmp_path / "merged")
            == (len(_rows(tmp_path / "whole")), 0, 0.0, tmp_path / "merged" / "results.jsonl"))
    assert _rows(tmp_path / "merged") == _rows(tmp_path / "whole")
    assert merge_stores([tmp_path / "shard0"], tmp_path / "merged")[:3] == (0, 0, 0.0)  # merging again adds nothing


def _write(directory, rows):
    (directory / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_a_method_two_runs_hold_is_kept_once_where_their_batches_differ(model_dir, tmp_path):
    """Two runs of other methods that share one (flat): each answered flat's children in another padded batch, so
    its values may differ in their last digits (here made to differ surely); merge keeps the first store's copy.
    From one batch, other values are a conflict."""
    run_compare(_settings(model_dir, tmp_path / "a"), show_progress=False)
    run_compare(_settings(model_dir, tmp_path / "b", allocators=["flat"]), show_progress=False)
    rows_b = [json.loads(line) for line in (tmp_path / "b" / "results.jsonl").read_text().splitlines()]
    flat_a = {(r["task"], r["item"], r["question"]): r for r in _rows(tmp_path / "a") if r["allocator"] == "flat"}
    flat_b = [r for r in rows_b if r["allocator"] == "flat"]
    assert flat_b and all(r["batch"] != flat_a[(r["task"], r["item"], r["question"])]["batch"] for r in flat_b)
    assert all("batch" not in r for r in rows_b if r["press"] == "none")  # the full cache is answered alone
    _write(tmp_path / "b", [{**r, "kl": r["kl"] + 1e-9} if r in flat_b else r for r in rows_b])
    merged = merge_stores([tmp_path / "a", tmp_path / "b"], tmp_path / "merged")
    assert merged[:2] == (len(_rows(tmp_path / "a")), len(flat_b))  # every row of b is a copy of one of a
    assert 0 < merged.largest_difference < 1e-4  # the batches themselves: 4e-6 measured
    assert _rows(tmp_path / "merged") == _rows(tmp_path / "a")
    # from one batch, or beyond what another batch gives (an NLL off by a nat, another prediction), a conflict
    first = flat_b[0]
    same_batch = {"batch": flat_a[(first["task"], first["item"], first["question"])]["batch"]}
    a_nat_more = {"answer_nll": first["answer_nll"] + 1.0, "delta_nll": first["delta_nll"] + 1.0}
    another_answer = {"prediction": first["prediction"] + "!", "agree": False}
    beyond = r" \(from two padded batches, which change only the last digits of NLL and KL\)"
    for changed, shown in ((same_batch, r"\w+ [-\d.e]+ and [-\d.e]+\): one key"),
                           (a_nat_more, f"answer_nll .*{beyond}"),
                           (another_answer, f"agree True and False\\){beyond}")):
        _write(tmp_path / "b", [{**r, "kl": r["kl"] + 1e-9, **changed} if r is first else r for r in rows_b])
        with pytest.raises(ValueError, match=f"with other values \\({shown}"):
            merge_stores([tmp_path / "a", tmp_path / "b"], tmp_path / "merged2")


def test_stores_of_other_settings_are_not_merged(model_dir, tmp_path):
    run_compare(_settings(model_dir, tmp_path / "a", shard=(0, 2)), show_progress=False)
    run_compare(_settings(model_dir, tmp_path / "b", shard=(1, 2), length=448), show_progress=False)
    with pytest.raises(ValueError, match="not shards of one run: they differ in length .*: keep each in its own store"):
        merge_stores([tmp_path / "a", tmp_path / "b"], tmp_path / "merged")
    assert not (tmp_path / "merged" / "results.jsonl").exists() or not _rows(tmp_path / "merged")


@pytest.mark.parametrize("shard", [(2, 2), (-1, 2)])
def test_a_shard_outside_its_count_is_refused(model_dir, tmp_path, shard):
    with pytest.raises(ValueError, match=r"shard must be a \(k, n\) tuple of integers with 0 <= k < n"):
        run_compare(_settings(model_dir, tmp_path, shard=shard), show_progress=False)


@pytest.fixture
def one_thread():
    """This process on one thread, as every worker runs (ContextWorker): float sums then add up in the same order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is the optional 'ray' extra")
def test_ray_actors_give_the_rows_of_one_process(model_dir, tmp_path, one_thread):
    run_compare(_settings(model_dir, tmp_path / "one"), show_progress=False)
    run_compare(_settings(model_dir, tmp_path / "ray", executor="ray", jobs=2), show_progress=False)
    assert _rows(tmp_path / "ray") == _rows(tmp_path / "one")


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is the optional 'ray' extra")
def test_ray_actors_are_given_jobs_a_few_ahead(model_dir, tmp_path, one_thread):
    """A run of ``--n 100000000`` on Ray: the first rows come back with a few jobs taken, not every job queued."""
    from itertools import count

    from bench.run.compare import plan
    from bench.run.execution import ContextJob
    from bench.run.ray_workers import in_ray
    from pretrained import loading

    run = plan(_settings(model_dir, tmp_path / "ray", executor="ray", jobs=2, n=10**8))
    taken = []

    def jobs():
        for index in count():
            taken.append(index)
            yield ContextJob("niah_single_1", index)

    rows = in_ray(run, loading.identity(model_dir), jobs(), workers=2)
    assert next(rows) and len(taken) <= 2 * 2 + 1
    rows.close()


@pytest.mark.parametrize("executor", ["local", pytest.param("ray", marks=pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="Ray is the optional 'ray' extra"))])
def test_a_worker_that_cannot_load_the_model_is_one_error_whatever_runs_it(model_dir, tmp_path, capsys, executor):
    """The parent no longer loads the model: what only loading finds (here a damaged tokenizer) is found by the
    workers, and reaches the user as the same one line a run in this process gives, not as Ray's actor error."""
    import shutil

    from bench.commands.cli import main

    broken = tmp_path / "model"
    shutil.copytree(model_dir, broken)
    (broken / "tokenizer.json").write_text('{"version": "1.0"}')  # JSON, but no tokenizer: only loading finds it
    argv = ["compare", "--model", str(broken), "--press", "keydiff", "--keep-fractions", "0.5", "--n", "1",
            "--tasks", "niah_single_1", "--length", "384"]
    assert main([*argv, "--out", str(tmp_path / "alone")]) == 2
    alone = capsys.readouterr().err.strip().splitlines()[-1]
    assert alone.startswith("bench compare: error: ") and "its tokenizer could not be loaded" in alone
    assert main([*argv, "--out", str(tmp_path / "workers"), "--executor", executor, "--jobs", "2"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == alone
    assert not (tmp_path / "workers").exists()


def test_a_press_that_cannot_run_on_the_model_is_one_error_from_the_workers(model_dir, tmp_path, capsys):
    """Found where the model loads (in each worker, the parent loads none): one line, and no store left behind."""
    import shutil

    from bench.commands.cli import main

    bare = tmp_path / "model"
    shutil.copytree(model_dir, bare)
    shutil.rmtree(bare / "gatesight")
    code = main(["compare", "--model", str(bare), "--press", "gatesight", "--out", str(tmp_path / "out"),
                 "--jobs", "2", "--n", "1", "--tasks", "niah_single_1", "--keep-fractions", "0.5"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("bench compare: error: press 'gatesight' cannot run on")
    assert "GateSight needs an estimator and none was found in" in last and not (tmp_path / "out").exists()


def test_a_run_merged_into_one_shards_store_is_told_to_merge_the_shards_first(model_dir, tmp_path):
    """The store merged into counts as one more source: the advice is the one two sources get."""
    run_compare(_settings(model_dir, tmp_path / "s0", shard=(0, 2)), show_progress=False)
    run_compare(_settings(model_dir, tmp_path / "w", allocators=["flat"]), show_progress=False)
    before = (tmp_path / "s0" / "results.jsonl").read_bytes()
    with pytest.raises(ValueError, match="is one shard of a sharded run: merge the shards of each run first"):
        merge_stores([tmp_path / "w"], tmp_path / "s0")
    assert (tmp_path / "s0" / "results.jsonl").read_bytes() == before


def test_a_stopped_run_with_jobs_still_queued_for_its_workers_exits(tmp_path):
    """Jobs the workers never took (here they fail before taking any) can be larger than the pipe to them: the
    driver raises the workers' error and then exits, instead of waiting for ever to flush those jobs at exit."""
    import subprocess
    import sys

    script = tmp_path / "stopped.py"
    script.write_text(
        "from bench.run.execution import ContextJob, in_processes\n"
        "big = frozenset(('niah_single_1', i, 'q', 'keydiff', 'flat', 0.5) for i in range(20000))\n"
        "jobs = [ContextJob('niah_single_1', i, big) for i in range(8)]  # each ≈ 1 MB pickled, the pipe 64 KiB\n"
        "try:\n"
        "    list(in_processes(None, None, jobs, workers=2))  # no run: each worker fails at once\n"
        "except Exception as error:\n"
        "    print('raised', type(error).__name__)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("raised"), done.stderr[-2000:]


def _start_compare(model_dir, out, n=40, **env):
    """``bench compare --jobs 2`` in a session of its own (a terminal's process group), ``n`` contexts to answer."""
    import os
    import signal
    import subprocess
    import sys

    argv = [sys.executable, "-m", "bench.entry", "compare", "--model", str(model_dir), "--out", str(out), "--jobs", "2",
            "--press", "keydiff", "--keep-fractions", "0.5", "--tasks", "niah_single_1", "--n", str(n),
            "--length", "384"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYBRIDPRESS_CACHE": str(out.parent / "cache"), **env}
    # Ctrl-C at its default, as in a terminal: a test run started in the background of a script (`cmd &` in
    # bash) passes SIGINT on ignored, and Python keeps a signal ignored at startup ignored
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _ended(driver, seconds=120.0) -> str:
    """The driver's standard error once it ended; a driver still running then (and its workers) is killed, and
    the test fails as a hang rather than leaving them behind."""
    import os
    import signal
    import subprocess

    try:
        return driver.communicate(timeout=seconds)[1]
    except subprocess.TimeoutExpired:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.communicate()
        raise AssertionError(f"bench compare --jobs 2 still ran {seconds} s later (killed)") from None


def _workers(driver_pid, count=2, seconds=60.0):
    """The pids of the driver's ``count`` worker processes, once they are all started."""
    import time
    from pathlib import Path

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = []
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if parent == driver_pid and b"spawn_main" in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except (OSError, IndexError, ValueError):  # a process that ended meanwhile
                continue
        if len(found) == count:
            return found
        time.sleep(0.05)
    raise AssertionError(f"the driver {driver_pid} did not start {count} workers in {seconds} s")


def _answering(out, seconds=120.0):
    """Once the first rows are in the store: the workers have loaded the model and answer contexts."""
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if (out / "results.jsonl").exists() and (out / "results.jsonl").stat().st_size:
            return
        time.sleep(0.05)
    raise AssertionError(f"no row reached {out} in {seconds} s")


def _gone(pid, seconds=60.0):
    import os
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    os.kill(pid, 9)
    return False


def test_the_workers_of_a_driver_killed_by_sigkill_end(model_dir, tmp_path):
    """A driver killed outright (SIGKILL, the out-of-memory killer) runs no cleanup: its workers notice it is gone
    and end, instead of each waiting for ever on the job queue with a model loaded."""
    import os
    import signal

    driver = _start_compare(model_dir, tmp_path / "out")
    workers = _workers(driver.pid)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait(timeout=60)
    assert all([_gone(pid) for pid in workers])


@pytest.mark.parametrize("stop", ["one worker killed", "one worker killed as it starts", "ctrl-c in the terminal"])
def test_a_run_whose_workers_are_stopped_from_outside_ends_in_one_line(model_dir, tmp_path, stop):
    """One worker killed (the out-of-memory killer) is one line naming the signal, also when it held no job (killed
    while loading: CI's run ended 0, the other worker having answered every context); a terminal's Ctrl-C, which
    reaches every process of its group, stops the driver alone (the workers hold it back), which then stops them:
    one line and 130, no traceback of a worker. What was finished is kept either way."""
    import os
    import signal

    out = tmp_path / "out"
    driver = _start_compare(model_dir, out)
    workers = _workers(driver.pid)
    if stop != "one worker killed as it starts":
        _answering(out)
    if stop.startswith("one worker killed"):
        os.kill(workers[-1], signal.SIGKILL)
    else:
        os.killpg(driver.pid, signal.SIGINT)
    err = _ended(driver)
    last = err.strip().splitlines()[-1]
    if stop.startswith("one worker killed"):
        assert driver.returncode == 2, err
        kept = "nothing was written yet" if stop.endswith("as it starts") else "what was finished is kept in"
        assert last.startswith("bench compare: error: a worker process died (killed by SIGKILL, as the out-of-memory "
                               f"killer does) before the run finished; {kept}"), err
    else:
        assert driver.returncode == 130, err
        assert last.startswith("bench compare: interrupted; what was finished is kept in"), err
    assert "Traceback" not in err and "leaked" not in err, err
    assert all([_gone(pid) for pid in workers])


def test_a_stopped_worker_is_named_and_the_run_ends_in_one_line(model_dir, tmp_path):
    """Issue 64: a worker stopped with ``kill -STOP`` (or wedged) never ends, so no end of file comes: the driver
    waited silently for ever. Each worker beats on its pipe; one silent for HYBRIDPRESS_WORKER_SILENCE seconds is
    named by its pid and killed, and the run ends in one line with what was kept."""
    import os
    import signal

    from bench.run.worker_watch import SILENCE_ENV

    out = tmp_path / "out"
    driver = _start_compare(model_dir, out, **{SILENCE_ENV: "4"})
    workers = _workers(driver.pid)
    _answering(out)
    os.kill(workers[-1], signal.SIGSTOP)
    try:
        err = _ended(driver)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(workers[-1], signal.SIGCONT)
    assert driver.returncode == 2, err
    assert err.strip().splitlines()[-1].startswith(
        f"bench compare: error: worker process {workers[-1]} has sent nothing for 4 s (stopped, as by kill -STOP, "
        f"or wedged; {SILENCE_ENV} sets how long a worker may stay silent): it was killed, and the run ended; what "
        "was finished is kept in"), err
    assert "Traceback" not in err, err
    assert all([_gone(pid) for pid in workers])
    assert (out / "results.jsonl").read_text().count("\n") >= 1


def test_a_run_stopped_and_continued_whole_is_not_taken_for_wedged(model_dir, tmp_path):
    """Probe 13: Ctrl-Z stops the whole process group, driver and workers, and ``fg`` continues it: the driver woke
    to find each worker "silent" for as long as it had itself been stopped, killed a healthy worker and ended the
    run. Its silence is counted on the driver's :class:`~bench.run.worker_watch.WatchClock`, which a stop of the
    driver does not advance: the run finishes, every row there."""
    import os
    import signal
    import time

    from bench.run.worker_watch import SILENCE_ENV

    out, n = tmp_path / "out", 8
    driver = _start_compare(model_dir, out, n=n, **{SILENCE_ENV: "4"})
    workers = _workers(driver.pid)
    _answering(out)
    os.killpg(driver.pid, signal.SIGSTOP)  # what Ctrl-Z does to a terminal's foreground group (SIGTSTP, not caught)
    time.sleep(10)
    os.killpg(driver.pid, signal.SIGCONT)
    err = _ended(driver)
    assert driver.returncode == 0 and "Traceback" not in err, err
    assert (out / "results.jsonl").read_text().count("\n") == 2 * n  # the no-prune row and keydiff's, per context
    assert all([_gone(pid) for pid in workers])


def test_the_watch_clock_counts_a_stop_of_the_driver_as_one_look(monkeypatch):
    """Time the driver ran counts whole; a gap longer than one look of its loop (it was stopped) counts as one look,
    so a worker's silence is never the driver's own stop."""
    from types import SimpleNamespace

    import bench.run.worker_watch as watch

    real = iter([100.0, 100.5, 101.5, 131.5, 132.0])  # looks 0.5 s and 1 s apart, then 30 s stopped
    monkeypatch.setattr(watch, "time", SimpleNamespace(monotonic=lambda: next(real)))
    clock = watch.WatchClock()
    assert [clock(), clock(), clock(), clock()] == [0.5, 1.5, 1.5 + watch.LOOK_SECONDS, 2.0 + watch.LOOK_SECONDS]


def test_a_killed_resource_tracker_leaves_no_traceback(model_dir, tmp_path):
    """Issue 64: after ``kill -KILL`` of the run's multiprocessing resource tracker, the run ended 0 and three raw
    ``KeyError: '/mp-…'`` tracebacks followed (its job queue's semaphores, unlinked through a new tracker that never
    knew them). Jobs go on pipes now: nothing is the tracker's to unlink."""
    import os
    import signal
    import time
    from pathlib import Path

    out = tmp_path / "out"
    driver = _start_compare(model_dir, out, n=6)
    _workers(driver.pid)
    deadline, tracker = time.monotonic() + 60, None
    while tracker is None and time.monotonic() < deadline:
        for proc in Path("/proc").glob("[0-9]*"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if parent == driver.pid and b"resource_tracker" in (proc / "cmdline").read_bytes():
                    tracker = int(proc.name)
    assert tracker is not None, "the driver started no resource tracker"
    os.kill(tracker, signal.SIGKILL)
    err = _ended(driver)
    assert driver.returncode == 0, err
    assert "Traceback" not in err and "KeyError" not in err and "resource_tracker" not in err, err


_DIES_WHILE_SENDING = """
import multiprocessing, os, signal
from multiprocessing import connection

_send_bytes = connection.Connection._send_bytes


def _dies_half_way(self, buf):  # a worker's rows: half a message, then the out-of-memory killer
    if multiprocessing.parent_process() is not None and len(buf) > 256:
        self._send(len(buf).to_bytes(4, "big") + bytes(buf[: len(buf) // 2]))
        os.kill(os.getpid(), signal.SIGKILL)
    _send_bytes(self, buf)


connection.Connection._send_bytes = _dies_half_way
"""


def test_a_worker_killed_part_way_through_sending_its_rows_ends_the_run_in_one_line(model_dir, tmp_path):
    """Probe 75: a worker killed after sending part of its rows left the driver waiting for the rest for ever (the
    workers shared one results pipe, which the other held open). A hook in every worker sends half of its first
    message and kills the worker."""
    import os

    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(_DIES_WHILE_SENDING)
    out = tmp_path / "out"
    driver = _start_compare(model_dir, out, PYTHONPATH=os.pathsep.join(filter(None, [str(hooks),
                                                                                     os.environ.get("PYTHONPATH")])))
    workers = _workers(driver.pid)
    err = _ended(driver)
    assert driver.returncode == 2, err
    assert err.strip().splitlines()[-1].startswith(
        "bench compare: error: a worker process died (killed by SIGKILL, as the out-of-memory killer does) before the "
        "run finished; nothing was written yet"), err
    assert "Traceback" not in err, err
    assert all([_gone(pid) for pid in workers])


def test_a_worker_whose_driver_is_gone_takes_no_queued_job(monkeypatch):
    """Probe 71: after its driver was killed a worker went on answering the jobs already queued (a context each)."""
    import multiprocessing
    import types

    from bench.run import execution

    jobs, driver = multiprocessing.Pipe(duplex=False)
    driver.send(execution.ContextJob("niah_single_1", 0))
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: types.SimpleNamespace(is_alive=lambda: False))
    assert execution._next_job(jobs) is None and jobs.poll()  # still queued, not taken
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: types.SimpleNamespace(is_alive=lambda: True))
    assert execution._next_job(jobs) == execution.ContextJob("niah_single_1", 0)
    driver.close()
    assert execution._next_job(jobs) is None  # the driver closed its end


def test_a_merge_stopped_after_its_first_row_is_finished_by_the_same_merge(model_dir, tmp_path):
    """Probe 72: stopped within its first rows, the rerun the stop line advised was refused (the partial store was
    checked as one more source, a run that did not finish)."""
    for k in range(2):
        run_compare(_settings(model_dir, tmp_path / f"s{k}", shard=(k, 2)), show_progress=False)
    sources = [tmp_path / "s0", tmp_path / "s1"]
    merge_stores(sources, tmp_path / "whole")
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    first = (tmp_path / "whole" / "results.jsonl").read_text().splitlines()[0]
    (stopped / "results.jsonl").write_text(first + "\n")  # what a merge stopped after one row leaves
    assert merge_stores(sources, stopped).added == len(_rows(tmp_path / "whole")) - 1
    assert _rows(stopped) == _rows(tmp_path / "whole")


def test_a_worker_silent_since_it_started_is_named_with_the_startup_allowance(monkeypatch):
    """Probe 8: a worker stopped before its first beat was waited on 600 s whatever HYBRIDPRESS_WORKER_SILENCE said,
    and the line then named that setting as what decided the wait."""

    from bench.run.stopping import WorkerDied
    from bench.run.worker_watch import SILENCE_ENV, STARTUP_SECONDS, raise_if_silent

    reader = object()
    with pytest.raises(WorkerDied) as died:
        raise_if_silent({reader: "worker process 41"}, {reader: None}, -STARTUP_SECONDS - 1, 5.0, 0.0)
    assert str(died.value) == (
        f"worker process 41 has sent nothing for {STARTUP_SECONDS:g} s since it started (stopped, as by kill -STOP, or "
        f"wedged; a worker still starting may take {STARTUP_SECONDS:g} s to send its first beat, {STARTUP_SECONDS:g} s "
        f"or {SILENCE_ENV} if longer): it was killed, and the run ended")
    raise_if_silent({reader: "worker process 41"}, {reader: None}, -10.0, 5.0, 0.0)  # still starting

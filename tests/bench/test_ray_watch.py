"""Ray actors are watched as ``--jobs`` worker processes are (probe 24, #2): one that never starts, or stops, is named
and the run ends; one that computes long is waited for, its beats answering meanwhile."""

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.bench.test_distributed import _settings

pytestmark = [pytest.mark.slow,  # ~15 s: a Ray instance; CI's slow run holds it
              pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is the optional 'ray' extra")]


@pytest.fixture(scope="module")
def ray_here():
    import ray

    ray.init(include_dashboard=False, log_to_driver=False, num_cpus=2)
    yield ray
    ray.shutdown()


def _answers(monkeypatch, model_dir, tmp_path, worker, starting: float = 60.0):
    """What ``in_ray`` gives with ``worker`` as its actors' class (one actor, one job), its silence 3 s and a worker
    starting allowed ``starting`` seconds."""
    import bench.run.ray_workers as ray_workers
    import bench.run.worker_watch as watch
    from bench.run.compare import plan
    from bench.run.execution import ContextJob
    from pretrained import loading

    monkeypatch.setenv(watch.SILENCE_ENV, "3")
    monkeypatch.setattr(watch, "STARTUP_SECONDS", starting)
    monkeypatch.setattr(ray_workers, "_RayWorker", worker)
    run = plan(_settings(model_dir, tmp_path / "ray", executor="ray", jobs=1))
    return list(ray_workers.in_ray(run, loading.identity(model_dir), [ContextJob("niah_single_1", 0)], workers=1))


def _gone(pid: int, within: float = 30.0) -> bool:
    """Whether process ``pid`` ended (or is a zombie) within ``within`` seconds."""
    ends = time.monotonic() + within
    while time.monotonic() < ends:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.2)
    return False


def test_an_actor_that_never_starts_is_named_within_the_startup_allowance(ray_here, model_dir, tmp_path,
                                                                         monkeypatch):
    """Ray could not start its worker processes (under ``prlimit --as``): the driver waited for ever, silently."""
    from bench.run.stopping import WorkerDied

    class NeverStarts:
        def __init__(self, run, identity):
            time.sleep(10**6)

        def beat(self):
            return os.getpid()

        def rows(self, job):
            return []

    started = time.monotonic()
    with pytest.raises(WorkerDied) as died:
        _answers(monkeypatch, model_dir, tmp_path, NeverStarts, starting=4.0)
    assert time.monotonic() - started < 60
    assert str(died.value).startswith("Ray worker 1 of 1 has sent nothing for 4 s since it started (stopped, as by "
                                      "kill -STOP, or wedged; a worker still starting may take 4 s")
    assert "Ray hides its workers' output here: their logs say why one did not start" in str(died.value)


def test_an_actor_stopped_in_a_job_is_named_by_its_pid_and_killed(ray_here, model_dir, tmp_path, monkeypatch):
    from bench.run.stopping import WorkerDied

    class StopsItself:
        def __init__(self, run, identity):
            pass

        def beat(self):
            return os.getpid()

        def rows(self, job):
            time.sleep(1.5)  # a beat answered first
            os.kill(os.getpid(), signal.SIGSTOP)

    with pytest.raises(WorkerDied) as died:
        _answers(monkeypatch, model_dir, tmp_path, StopsItself)
    said = str(died.value)
    assert said.startswith("Ray worker process ") and " has sent nothing for 3 s (stopped, as by kill -STOP, or " \
        "wedged; HYBRIDPRESS_WORKER_SILENCE sets how long a worker may stay silent): it was killed" in said, said
    assert _gone(int(said.split()[3]))


def test_an_actor_computing_longer_than_the_silence_is_waited_for(ray_here, model_dir, tmp_path, monkeypatch):
    class Slow:
        def __init__(self, run, identity):
            pass

        def beat(self):
            return os.getpid()

        def rows(self, job):
            time.sleep(6)  # twice the silence: its beats answer meanwhile
            return [{"task": job.task, "index": job.index}]

    assert _answers(monkeypatch, model_dir, tmp_path, Slow) == [[{"task": "niah_single_1", "index": 0}]]


def test_an_actor_killed_in_a_job_is_named_in_one_line(ray_here, model_dir, tmp_path, monkeypatch):
    """Probe 25, #2: a Ray worker killed (SIGKILL, as the out-of-memory killer does) ended the run in Ray's
    ``ActorDiedError`` traceback; it is named as a dead worker process is, and the run ends in one line."""
    from bench.run.stopping import WorkerDied

    class KillsItself:
        def __init__(self, run, identity):
            pass

        def beat(self):
            return os.getpid()

        def rows(self, job):
            time.sleep(1.5)  # a beat answered first: the worker is named by its pid
            os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(WorkerDied) as died:
        _answers(monkeypatch, model_dir, tmp_path, KillsItself)
    assert re.fullmatch(r"Ray worker process \d+ died before the run finished \(killed, as the out-of-memory killer "
                        r"does, or its node was lost; Ray's logs say which\)", str(died.value)), str(died.value)


@pytest.mark.parametrize("address", [None, "local"])
def test_a_ray_instance_starts_under_an_address_space_limit(address, monkeypatch):
    """Probe 25, #1: under ``prlimit --as=8000000000`` a local ``ray.init`` waited for ever, as every Ray process maps
    its object store (30 % of the memory by default); the run's instance holds a small one, ``--address local``'s
    too (probe 26, #1)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    script = ("import resource, sys\nresource.setrlimit(resource.RLIMIT_AS, (8 * 10**9, 8 * 10**9))\n"
              f"import ray, torch\nfrom bench.run.ray_workers import _join_ray\n_join_ray(ray, {address!r})\n"
              "print('joined', flush=True)\nray.shutdown()\n")
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.fail("ray.init did not return within 180 s under an 8 GB address-space limit")
    assert done.returncode == 0 and "joined" in done.stdout, done.stderr[-2000:]


def test_a_ray_instance_whose_gcs_stops_is_left_within_the_bound():
    """Probe 28, #1: with the run's GCS stopped (``kill -STOP``), every row was written and the run then waited for
    ever in ``ray.kill``/``ray.shutdown``, and at exit in Ray's own shutdown; it goes on after the bound, says so in
    one line, and the process ends with no Ray process of its instance left waiting."""
    script = (
        "import os, signal, ray\nfrom bench.run.ray_workers import _join_ray, _leave_ray\n_join_ray(ray, None)\n"
        "@ray.remote(num_cpus=1)\nclass Actor:\n    def pid(self):\n        return os.getpid()\n"
        "actor = Actor.remote()\nray.get(actor.pid.remote())\n"
        "node = ray._private.worker._global_node\n"
        "gcs = node.all_processes['gcs_server'][0].process.pid\nprint('gcs', gcs, flush=True)\n"
        "os.kill(gcs, signal.SIGSTOP)\n_leave_ray(ray, [actor], True, timeout=3)\nprint('left', flush=True)\n")
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "RAY_ADDRESS": ""})
    except subprocess.TimeoutExpired:
        pytest.fail("the process waited on Ray past 120 s")
    assert done.returncode == 0 and "left" in done.stdout, done.stderr[-2000:]
    assert ("note: Ray did not let go of the run's workers within 3 s (its head, GCS or raylet, does not answer): "
            "what was finished is kept; its processes were killed") in done.stderr
    assert _gone(int(done.stdout.split()[1]), within=10)
    assert time.monotonic() - started < 90

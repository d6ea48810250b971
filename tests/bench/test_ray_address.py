"""A Ray address that does not answer is one bench error within a stated timeout, before any work: ``ray.init``
itself retries such an address for minutes."""

import importlib.util
import socket
import threading
import time

import pytest

from bench.commands.cli import main
from bench.run.settings import RAY_ANSWER_SECONDS, check_ray_address
from pretrained import loading

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is the optional 'ray' extra")


@pytest.fixture
def listener():
    """A port that accepts connections and never answers, or, once ``reply`` holds bytes, reads the client's first
    bytes and answers with those (an HTTP/1 server, not gRPC)."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted, reply = [], []

    def serve():
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            accepted.append(connection)
            if reply:
                connection.recv(1024)
                connection.sendall(reply[0])
                connection.shutdown(socket.SHUT_WR)

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1], reply
    server.close()
    for connection in accepted:
        connection.close()


def _compare(model_dir, tmp_path, address) -> int:
    return main(["compare", "--model", str(model_dir), "--out", str(tmp_path / "out"), "--press", "keydiff",
                 "--executor", "ray", "--address", address])


def test_an_address_nothing_listens_on_fails_at_once(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(loading, "load", lambda *a, **k: pytest.fail("the model loaded before the refusal"))
    started = time.monotonic()
    assert _compare(model_dir, tmp_path, "127.0.0.1:1") == 2
    assert time.monotonic() - started < RAY_ANSWER_SECONDS
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bench compare: error: --address 127.0.0.1:1: no Ray cluster "
                                                   f"answers there within {RAY_ANSWER_SECONDS:g} s"), err


def test_a_port_that_never_answers_fails_within_the_timeout(listener):
    port, _ = listener
    started = time.monotonic()
    with pytest.raises(ValueError, match="no Ray cluster answers there within 0.5 s \\(no answer\\)"):
        check_ray_address(f"127.0.0.1:{port}", timeout=0.5)
    assert time.monotonic() - started < 2


def test_a_server_that_is_not_ray_is_named(model_dir, tmp_path, capsys, listener):
    port, reply = listener
    reply.append(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    assert _compare(model_dir, tmp_path, f"127.0.0.1:{port}") == 2
    assert "something answers there, but not a Ray cluster" in capsys.readouterr().err


def test_a_ray_client_address_is_refused_before_work(model_dir, tmp_path, capsys, listener, no_model_load):
    """Probe 27, #1: ``ray://`` (Ray's client, which the ``ray`` extra does not install, and the bench's advice
    named) passed the check and ended in ``ray.init``'s traceback."""
    port, reply = listener
    reply.append(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))  # answers as a gRPC server would
    assert _compare(model_dir, tmp_path, f"ray://127.0.0.1:{port}") == 2
    err = capsys.readouterr().err
    assert err == (f"bench compare: error: --address ray://127.0.0.1:{port}: ray:// is Ray's client, which the bench "
                   "does not run through; give the head node's GCS address (HOST:PORT, port 6379 by default)\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("environment", "says"), [
    ("nope", "RAY_ADDRESS=nope: expected HOST:PORT"),
    ("127.0.0.1:1", "RAY_ADDRESS=127.0.0.1:1: no Ray cluster answers there within 5 s (Connection refused); check "
                    "the head node's address and port, or unset RAY_ADDRESS to start Ray for the run"),
    ("ray://127.0.0.1:1", "RAY_ADDRESS=ray://127.0.0.1:1: ray:// is Ray's client")])
def test_the_environments_ray_address_is_checked_as_the_option_is(model_dir, tmp_path, capsys, monkeypatch,
                                                                  no_model_load, environment, says):
    """Probe 27, #1 and U1: with ``--address`` left out, ``ray.init`` reads ``RAY_ADDRESS``, which was never checked:
    ``nope`` ended in Ray's ValueError traceback, and a port nothing listens on waited 60 s to be called "something
    answers there"."""
    monkeypatch.setenv("RAY_ADDRESS", environment)
    assert main(["compare", "--model", str(model_dir), "--out", str(tmp_path / "out"), "--press", "keydiff",
                 "--executor", "ray"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bench compare: error: {says}") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_rays_own_refusal_of_an_address_is_one_line(monkeypatch):
    """What ``ray.init`` raises of an address or a cluster it cannot join (a ValueError, a ConnectionError) is one
    line naming the address, not Ray's traceback."""
    from types import SimpleNamespace

    from bench.run.ray_workers import _join_ray
    from runtime.errors import UsageError

    def refuse(**given):
        raise ConnectionError("Could not find any running Ray instance.\nPlease specify the one to connect to.")

    with pytest.raises(UsageError, match=r"^--address auto: Ray could not join a cluster there \(ConnectionError: "
                                         r"Could not find any running Ray instance\. Please specify"):
        _join_ray(SimpleNamespace(init=refuse), "auto", timeout=5)


@pytest.mark.parametrize("address", ["abc", "10.0.0.1:", ":6379", "host:port"])
def test_an_address_that_is_not_host_and_port_is_refused(address):
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        check_ray_address(address)


@pytest.mark.slow  # ~7 s: a process that imports Ray; CI's slow run holds it
def test_joining_a_server_that_answers_grpc_but_is_not_ray_is_bounded(listener):
    """A gRPC server of another kind passes the address check (it answers HTTP/2); ``ray.init`` would then retry it
    for minutes. The join is bounded: one clear error within the bound, and the process exits at once after it."""
    import subprocess
    import sys

    port, reply = listener
    reply.append(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))  # an empty HTTP/2 SETTINGS frame, as any gRPC server sends
    check_ray_address(f"127.0.0.1:{port}", timeout=2)  # let through: it looks like gRPC
    script = ("import ray, sys\nfrom bench.run.ray_workers import _join_ray\nfrom runtime.errors import UsageError\n"
              f"try:\n    _join_ray(ray, '127.0.0.1:{port}', timeout=3)\nexcept UsageError as error:\n"
              "    print(error)\n    sys.exit(7)\n")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 7, done.stderr[-2000:]
    assert f"--address 127.0.0.1:{port}: no Ray cluster joined within 3 s" in done.stdout
    assert time.monotonic() - started < 60


@pytest.mark.parametrize(("address", "environment", "starts_here"), [
    (None, None, True), ("local", None, True), (None, "local", True), (None, "10.0.0.1:6379", False),
    ("auto", None, False), ("10.0.0.1:6379", "local", False)])
def test_a_ray_instance_started_here_holds_a_small_object_store(address, environment, starts_here, monkeypatch):
    """Probe 26, #1: ``--address local`` started Ray here with its default object store, which an address-space
    limit refuses (``ray.init`` then waited for ever); a cluster joined takes no store size (Ray refuses one)."""
    from types import SimpleNamespace

    from bench.run.ray_workers import OBJECT_STORE_BYTES, _join_ray
    from bench.run.settings import RAY_ADDRESS_ENV

    if environment is None:
        monkeypatch.delenv(RAY_ADDRESS_ENV, raising=False)
    else:
        monkeypatch.setenv(RAY_ADDRESS_ENV, environment)
    calls = []
    _join_ray(SimpleNamespace(init=lambda **given: calls.append((threading.current_thread(), given))), address)
    [(thread, given)] = calls
    assert given["address"] == address
    assert (given.get("object_store_memory") == OBJECT_STORE_BYTES) == starts_here
    assert (thread is threading.main_thread()) == starts_here  # its processes die with the thread that starts them


def test_leaving_a_ray_that_never_answers_is_bounded(capsys):
    """Probe 28, #1: ``ray.shutdown`` waits on the GCS, which a stopped head never answers; the run goes on past the
    bound with one line, and the processes of the instance it started are killed."""
    from types import SimpleNamespace

    from bench.run.ray_workers import _leave_ray

    never, killed = threading.Event(), []
    node = SimpleNamespace(kill_all_processes=lambda **how: killed.append(how))
    ray = SimpleNamespace(kill=lambda actor: None, shutdown=never.wait,
                          _private=SimpleNamespace(worker=SimpleNamespace(_global_node=node)))
    started = time.monotonic()
    _leave_ray(ray, ["actor"], True, timeout=0.5)
    assert time.monotonic() - started < 5
    assert killed == [{"check_alive": False, "allow_graceful": False}]
    assert capsys.readouterr().err == ("\nnote: Ray did not let go of the run's workers within 0.5 s (its head, GCS or "
                                       "raylet, does not answer): what was finished is kept; its processes were "
                                       "killed (its agents end by themselves within minutes)\n")
    never.set()


def test_a_ray_instance_that_does_not_come_up_is_one_line(monkeypatch):
    """Probe 29, #3: the run's own instance, its GCS stopped or killed while it started, ended in Ray's bare
    ``Exception`` traceback."""
    from types import SimpleNamespace

    from bench.run.ray_workers import _join_ray
    from runtime.errors import UsageError

    def fail(**given):
        raise Exception("The current node timed out during startup. This could happen because some of the raylet "
                        "failed to startup or the GCS has become overloaded.")

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(UsageError, match=r"^the Ray instance started for the run did not come up \(Exception: The "
                                         r"current node timed out during startup\. .*\); its logs say why"):
        _join_ray(SimpleNamespace(init=fail), None)

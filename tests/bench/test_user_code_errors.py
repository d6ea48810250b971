"""Probe 11: a user's press that raised in ``score`` or ``__post_init__``, or a user's allocator that raised in
``allocate``, ended ``bench compare`` in a full traceback (exit 1; under ``--jobs 2`` through the worker's pipe). Each
is one line naming the press or allocator, the error and the user's file and line, then what the run kept (exit 2);
``--debug`` shows the user's traceback, also from a worker. The project's own code failing stays a bug with its
traceback."""

import json
import re
import sys

import pytest
import torch

import presses
from allocators.flat import FlatAllocator
from bench.commands.cli import main
from bench.store.project_modules import ROOT
from presses import registry
from presses.keydiff import KeyDiffPress
from runtime import prefill
from runtime.user_code import PROJECT_PACKAGES, UserCodeError
from tests.helpers import run_cli

RAISING = '''import os
from dataclasses import dataclass

import allocators
import presses
from allocators.flat import FlatAllocator
from presses.snapkv import SnapKVPress


@presses.register
@dataclass
class RaisingPress(SnapKVPress):
    name = "praise"

    def score(self, context):
        raise RuntimeError("boom in user score")


@presses.register
@dataclass
class BuiltBadly(SnapKVPress):
    name = "ppost"

    def __post_init__(self):
        raise ValueError("window too odd")


@allocators.register
@dataclass
class RaisingAllocator(allocators.Allocator):
    name = "araise"

    def allocate(self, request):
        raise KeyError("no such head")


class Boom(BaseException):
    pass


class Flip(dict):
    """Counts that pass the check when first read, then others."""
    reads = 0

    def __getitem__(self, key):
        Flip.reads += 1
        return dict.__getitem__(self, key) if Flip.reads <= 3 else [10**6] * 2


def _press(name, **methods):
    presses.register(dataclass(type(name, (SnapKVPress,), {"name": name, "__module__": __name__, **methods})))


def _allocator(name, **methods):
    allocators.register(dataclass(type(name, (FlatAllocator,), {"name": name, "__module__": __name__, **methods})))


_press("pox", score=lambda self, context: os._exit(0))
_press("pevid", evidence=lambda self, adapter: 1 / 0)
_press("pbind", bind=lambda self, model: [][0])
_press("pcheck", check=lambda self, adapter: {}["x"])
_press("pcode", code_objects=lambda self: 1 / 0)
_press("pbase", score=lambda self, context: (_ for _ in ()).throw(Boom("of its own")))
_press("pgexit", score=lambda self, context: (_ for _ in ()).throw(GeneratorExit("closed")))
_press("pclear", score=lambda self, context: context.kv.clear())
_allocator("abase", allocate=lambda self, request: (_ for _ in ()).throw(Boom("of its own")))
_allocator("achk", check_layers=lambda self, count: 1 / 0)
_allocator("aflip", allocate=lambda self, request: Flip(FlatAllocator.allocate(self, request)))
_pending = []


def _later(self, context):
    """SnapKV's scores, and a thread that negates the keys it kept once the allocator below lets it: after the check
    around this scoring, before the rows (probe 13's press, made sure of its timing); from the scoring numbered
    $PLATE_FROM on."""
    import threading

    scores, keys = SnapKVPress.score(self, context), next(iter(context.kv.values())).keys
    go, done = threading.Event(), threading.Event()

    def change():
        go.wait(60)
        keys.mul_(-1.0)
        done.set()

    if len(_pending) >= int(os.environ.get("PLATE_FROM", "0")):
        threading.Thread(target=change, daemon=True).start()
    else:  # nothing to wait for: the allocator goes on at once
        done.set()
    _pending.append((go, done))
    return scores


def _let_it(self, request):
    go, done = _pending[-1]
    go.set()
    done.wait(60)
    return FlatAllocator.allocate(self, request)


def _halve(self, context):
    scores = SnapKVPress.score(self, context)
    for parameter in context.adapter.model.parameters():
        parameter.data.mul_(0.5)
    return scores


_press("plate", score=_later)
_allocator("alet", allocate=_let_it)
_press("pdata", score=_halve)
_press("pfloat", score=lambda self, context: {float(layer): scores
                                              for layer, scores in SnapKVPress.score(self, context).items()})
_press("pextra", score=lambda self, context: (lambda s: {**s, 0: s[max(s)]})(SnapKVPress.score(self, context)))
_press("pplain")
'''
"""A user's module: ``praise`` raises on line 14, ``ppost`` on line 23, ``araise`` on line 32, each press or
allocator made by ``_press`` or ``_allocator`` on its own line after 56; after them, probe 13's presses (``plate``
with ``alet``, ``pdata``), then probe 14's (``pfloat`` keys its scores by floats, ``pextra`` scores layer 0, a GDN
layer, too) and ``pplain``, SnapKV as a user's press."""


@pytest.fixture
def users_module(tmp_path, monkeypatch):
    """``m_raising.py`` in ``tmp_path``, the working directory, with the registries and ``sys.path`` put back after."""
    (tmp_path / "m_raising.py").write_text(RAISING)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(registry, "PRESSES", dict(registry.PRESSES))
    import allocators
    monkeypatch.setattr(allocators, "ALLOCATORS", dict(allocators.ALLOCATORS))
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield tmp_path / "m_raising.py"
    sys.modules.pop("m_raising", None)


def _compare(model_dir, out, *flags):
    return ["compare", *flags, "--keep-fractions", "0.3", "--tasks", "niah_single_1", "--length", "300", "--model",
            model_dir, "--out", out, "--import", "m_raising"]


@pytest.mark.parametrize("jobs", [1, pytest.param(2, marks=pytest.mark.slow)])  # workers: the process-heavy run
@pytest.mark.parametrize("method, said", [
    ("praise/flat", "press praise raised RuntimeError in score: boom in user score ({file}:16)"),
    ("ppost/flat", "press ppost raised ValueError as it was built: window too odd ({file}:25)"),
    ("snapkv/araise", "allocator araise raised KeyError in allocate: 'no such head' ({file}:34)"),
    ("pox/flat", "press pox called os._exit(0) in score; a press or allocator the bench runs returns its result and "
                 "never ends the process"),
    ("pevid/flat", "press pevid raised ZeroDivisionError in evidence: division by zero ({file}:59)"),
    ("pcheck/flat", "press pcheck raised KeyError in check: 'x' ({file}:61)"),
    ("pbase/flat", "press pbase raised Boom in score: of its own ({file}:63)"),
    ("pgexit/flat", "press pgexit raised GeneratorExit in score: closed ({file}:64)"),
    ("pclear/flat", "press pclear changed the context it scores (kv): a press reads the context and returns scores"),
    ("snapkv/abase", "allocator abase raised Boom in allocate: of its own ({file}:66)"),
    # probe 13: a thread of the press changed the context after the check around its scoring; .data escapes version
    # counters: both found before any row of the context is written
    ("plate/alet", "the context changed after press plate scored it (kv["),
    ("pdata/flat", "the model's weights changed after press pdata scored the context (model.embed_tokens.weight: its "
                   "SHA-256 differs), before its rows were written: a press reads the context and returns scores"),
])
def test_a_users_code_raising_is_one_line_naming_it(model_dir, tmp_path, users_module, capsys, jobs, method, said):
    code, err = run_cli(capsys, *_compare(model_dir, tmp_path / "out", "--methods", method, "--n", jobs, "--jobs",
                                          jobs))
    assert code == 2 and "Traceback" not in err, err
    assert err.startswith(f"bench compare: error: {said.format(file=users_module)}"), err
    assert "run the same command again" in err, err


def test_a_context_changed_after_its_scoring_has_no_row_written(model_dir, tmp_path, users_module, capsys,
                                                                 monkeypatch):
    """Probe 13: a press's thread changed the context after the check around its scoring: the rows made from it were
    written (every one, on a second try), verify passed and a resume kept them. The first context's rows are kept; of
    the second, changed, none is written."""
    monkeypatch.setenv("PLATE_FROM", "1")
    code, err = run_cli(capsys, *_compare(model_dir, tmp_path / "out", "--methods", "plate/alet", "--n", 2))
    assert code == 2 and "the context changed after press plate scored it (kv[" in err, err
    assert "the context's rows were not written; what was finished is kept" in err, err
    rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert sorted((row["item"], row["press"]) for row in rows) == [(0, "none"), (0, "plate")]


@pytest.mark.parametrize("press, said", [
    ("pfloat", "press pfloat returned scores that have the key 1.0 (float), not an attention layer's index, an int "
               "(layers [1, 3]); "),
    ("pextra", "press pextra returned scores that have the key 0, not an attention layer (layers [1, 3]); "),
])
def test_a_users_scores_keyed_by_no_attention_layer_leave_the_store_usable(model_dir, tmp_path, users_module, capsys,
                                                                           press, said):
    """Probe 14: scores keyed ``3.0`` passed the check and wrote rows keyed ``'3.0'``, which every later command on
    the store refused (its good rows too); scores of layer 0 (a GDN layer) ended in a ``KeyError``. Both are one
    line, before any row of theirs, and the store's rows still verify."""
    out = tmp_path / "out"
    assert run_cli(capsys, *_compare(model_dir, out, "--methods", "snapkv/flat", "--n", 1))[0] == 0
    code, err = run_cli(capsys, *_compare(model_dir, out, "--methods", f"snapkv/flat,{press}/flat", "--n", 1))
    assert code == 2 and err.startswith(f"bench compare: error: {said}"), err
    assert run_cli(capsys, "verify", out)[0] == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {row["press"] for row in rows} == {"none", "snapkv"}


def _made_badly(answered_row, press):
    """``answered_row`` whose rows of ``press`` hold their per-layer recall keyed ``'1.0'`` as read back: what probe
    14's float-keyed scores wrote, made by a press the check now refuses."""
    def made(*args, **kwargs):
        row = answered_row(*args, **kwargs)
        if row["press"] == press and row.get("needle_recall_layers"):
            row["needle_recall_layers"] = {float(layer): heads for layer, heads in row["needle_recall_layers"].items()}
        return row
    return made


@pytest.mark.slow  # ~3 s: three runs; CI's slow run holds it
def test_a_row_the_store_would_refuse_is_never_written(model_dir, tmp_path, users_module, capsys, monkeypatch):
    """Probe 14: a row that the store's own checks refuse was appended, and blocked every later command on the
    store. A context with such a row has none written: one line naming the user's press and the problem; the
    bench's own press making one is a bug, its traceback kept. The store's rows still verify."""
    from bench.run import context_run

    out = tmp_path / "out"
    assert run_cli(capsys, *_compare(model_dir, out, "--methods", "snapkv/flat", "--n", 1))[0] == 0
    monkeypatch.setattr(context_run, "answered_row", _made_badly(context_run.answered_row, "pplain"))
    code, err = run_cli(capsys, *_compare(model_dir, out, "--methods", "pplain/flat", "--n", 1))
    assert code == 2 and err.startswith(
        "bench compare: error: press pplain with allocator flat at keep fraction 0.3 made a row of niah_single_1 "
        "item 0 that the store would refuse: needle_recall_layers has the layer '1.0' (expected an attention layer's "
        "index, e.g. '7'); none of the context's rows was written; "), err
    monkeypatch.setattr(context_run, "answered_row", _made_badly(context_run.answered_row, "keydiff"))
    with pytest.raises(RuntimeError, match="^press keydiff with allocator flat .* the store would refuse: .*; none "
                                           r"of the context's rows was written \(a bug of the bench"):
        main(list(map(str, _compare(model_dir, out, "--methods", "keydiff/flat", "--n", 1))))
    assert run_cli(capsys, "verify", out)[0] == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {row["press"] for row in rows} == {"none", "snapkv"}


@pytest.mark.parametrize("method, said", [
    ("pbind/flat", "press pbind raised IndexError in bind: list index out of range ({file}:60)"),
    ("pcode/flat", "press pcode raised ZeroDivisionError in code_objects: division by zero ({file}:62)"),
    ("snapkv/achk", "allocator achk raised ZeroDivisionError in check_layers: division by zero ({file}:67)"),
])
def test_a_users_code_raising_before_the_run_is_one_line_naming_it(model_dir, tmp_path, users_module, capsys,
                                                                    method, said):
    """Probe 12: ``bind``, ``code_objects`` and ``check_layers`` run as the run is planned, before any model loads."""
    code, err = run_cli(capsys, *_compare(model_dir, tmp_path / "out", "--methods", method, "--n", 1))
    assert code == 2 and "Traceback" not in err, err
    assert err.startswith(f"bench compare: error: {said.format(file=users_module)}; "), err


@pytest.mark.slow  # workers
def test_debug_shows_the_users_traceback_from_a_worker(model_dir, tmp_path, users_module, capsys):
    capsys.readouterr()
    code = main(list(map(str, _compare(model_dir, tmp_path / "out", "--methods", "praise/flat", "--n", 2, "--jobs", 2,
                                       "--debug"))))
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" in err, err
    assert f'File "{users_module}", line 16, in score' in err, err
    assert err.splitlines()[-1].startswith("bench compare: error: press praise raised RuntimeError in score"), err


@pytest.fixture
def parent(tiny):
    torch.manual_seed(0)
    return prefill(tiny("qwen3_5"), torch.randint(0, 97, (40,)), protected=4)


def test_the_projects_own_press_failing_keeps_its_traceback(parent, monkeypatch):
    """A bug of the bench's own press is no user's error: its exception goes on up as raised."""
    def broken(self, context):
        raise RuntimeError("a bug of the bench")

    monkeypatch.setattr(KeyDiffPress, "score", broken)
    with pytest.raises(RuntimeError, match="a bug of the bench") as raised:
        presses.compress(parent, KeyDiffPress(), "flat", keep_fraction=0.5)
    assert not isinstance(raised.value, UserCodeError)


def test_a_class_made_outside_the_project_is_the_users(parent):
    """Decided by where the class comes from: here ``type()`` over a project class, in this test module."""
    raising = type("Made", (FlatAllocator,), {"allocate": lambda self, request: 1 / 0})
    with pytest.raises(UserCodeError, match=re.escape("allocator flat raised ZeroDivisionError in allocate: division "
                                                      "by zero (") + ".*test_user_code_errors.py:"):
        presses.compress(parent, KeyDiffPress(), raising(), keep_fraction=0.5)


def test_the_project_packages_are_those_the_project_installs():
    """:data:`runtime.user_code.PROJECT_PACKAGES` tells the bench's classes from a user's: it names what
    ``pyproject.toml`` installs."""
    found = re.search(r"\[tool\.setuptools\.packages\.find\][^\[]*include = \[([^\]]*)\]",
                      (ROOT / "pyproject.toml").read_text())  # tomllib is Python 3.11's, the project runs on 3.10
    assert sorted(PROJECT_PACKAGES) == sorted(re.findall(r'"(\w+)\*"', found.group(1)))

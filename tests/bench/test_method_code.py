"""A row's code in two parts: what its setting group shares and what its method owns. Editing one press re-versions
only its rows, editing the runtime re-versions all; a user's own press is part of its rows' identity (an edited one is
refused beside its old rows, never pooled); a press joins a store's group by running only its own rows; a press from
an installed package or a ``--import``ed module runs from ``bench compare``."""

import importlib
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import allocators
import bench.store.project_modules
import presses
from bench.run.compare import run_compare
from bench.store.code_version import code_version, method_codes, result_modules
from bench.store.result_store import ResultStore
from presses import registry
from runtime.errors import UsageError
from tests.helpers import compare_settings, run_cli

RECENCY = '''
from dataclasses import dataclass

import torch

import presses


@presses.register
@dataclass
class RecencyPress(presses.Press):
    """Keep the most recent entries."""

    name = "recency"

    def score(self, context):
        n_body = context.n - context.protected
        age = torch.arange(n_body - 1, -1, -1, dtype=torch.float32, device=context.adapter.device)
        heads = context.adapter.geometry.num_kv_heads
        return {layer: (SIGN * age).expand(heads, n_body) for layer in context.adapter.attention_layers}
'''
"""A user's press; ``SIGN`` -1 keeps the newest entries, +1 the oldest."""


def _codes() -> dict[str, str]:
    methods = {"keydiff/flat": ("keydiff", "flat"), "snapkv/flat": ("snapkv", "flat"),
               "gatesight/gate": ("gatesight", "gate")}
    built = [(presses.get(press), allocators.get(allocator)) for press, allocator in methods.values()]
    return {"shared": code_version(), **dict(zip(methods, method_codes(built)))}


@pytest.fixture
def project_copy(tmp_path, monkeypatch) -> Path:
    """A copy of the project's packages that the code versions hash (``ROOT`` pointed at it)."""
    root = bench.store.project_modules.ROOT
    for package in ("runtime", "presses", "allocators", "workloads", "artifacts", "bench", "serving", "pretrained",
                    "gatesight_learning"):
        for path in (root / package).rglob("*.py"):
            target = tmp_path / path.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(path.read_text())
    shutil.copytree(root / "workloads" / "haystacks", tmp_path / "workloads" / "haystacks")
    monkeypatch.setattr(bench.store.project_modules, "ROOT", tmp_path)
    return tmp_path


def _append(path: Path, line: str) -> None:
    with path.open("a") as f:
        f.write(f"\n{line}\n")


def test_a_press_edit_reversions_its_own_rows_and_a_runtime_edit_all(project_copy, monkeypatch):
    before = _codes()
    assert len(set(before.values())) == len(before)  # each method's code is its own
    _append(project_copy / "presses" / "keydiff.py", "KEYDIFF_CHANGE = 1")
    after = _codes()
    assert {k for k in before if before[k] != after[k]} == {"keydiff/flat"}
    _append(project_copy / "allocators" / "flat.py", "FLAT_CHANGE = 1")
    again = _codes()
    assert {k for k in after if after[k] != again[k]} == {"keydiff/flat", "snapkv/flat"}
    # adding a press: a new file and its registry entry keep every other row's identity
    (project_copy / "presses" / "recency.py").write_text("class RecencyPress:\n    name = 'recency'\n")
    _append(project_copy / "presses" / "registry.py", "from .recency import RecencyPress  # noqa")
    monkeypatch.setattr(registry, "PRESSES", dict(registry.PRESSES))  # as that registry entry would register it
    presses.register(type("RecencyPress", (presses.Press,), {"name": "recency", "__module__": "presses.recency",
                                                             "score": lambda self, context: {}}))
    assert _codes() == again
    _append(project_copy / "runtime" / "kv.py", "RUNTIME_CHANGE = 1")
    last = _codes()
    assert last["shared"] != again["shared"] and {k: v for k, v in last.items() if k != "shared"} == {
        k: v for k, v in again.items() if k != "shared"}
    # so are the real-text haystacks' shipped snapshots (their bytes decide every real-text context)
    (project_copy / "workloads" / "haystacks" / "nodejs-docs.jsonl.gz").write_bytes(b"rebuilt")
    assert _codes()["shared"] != last["shared"]
    # the budget machinery is the group's: an edit of it re-versions every row
    assert {"allocators.base", "allocators.integerize", "presses.selection", "runtime.session",
            "bench.run.rows"} <= set(result_modules())
    assert not {"presses.keydiff", "allocators.flat", "presses.registry", "presses.gatesight"} & set(result_modules())


@pytest.fixture
def user_press(tmp_path, monkeypatch):
    """Write ``my_press.py`` with the given sign and (re)import it, as a user editing their module and rerunning."""
    monkeypatch.setattr(registry, "PRESSES", dict(registry.PRESSES))
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(sign: int):
        (tmp_path / "my_press.py").write_text(f"SIGN = {sign}\n" + RECENCY)
        registry.PRESSES.pop("recency", None)
        sys.modules.pop("my_press", None)
        importlib.invalidate_caches()
        return importlib.import_module("my_press")

    yield write
    sys.modules.pop("my_press", None)


def test_an_edited_user_press_is_refused_beside_its_old_rows_never_pooled(user_press, model_dir, tmp_path, capsys):
    out = tmp_path / "store"
    user_press(-1)
    settings = compare_settings(model_dir, out, presses=["recency", "none"], keep_fractions=[0.3])
    rows = run_compare(settings, show_progress=False).rows
    kept = (out / "results.jsonl").read_bytes()
    first = {r["method_code"] for r in rows if r["press"] == "recency"}
    assert len(first) == 1 and {r["method_code"] for r in rows if r["press"] == "none"} == {"none"}
    user_press(+1)  # keep the oldest entries instead: another method under the same name
    for fractions in ([0.3], [0.6]):  # a resume of the same setting, and a new fraction beside the old rows
        with pytest.raises(UsageError, match="another version of its own code"):
            run_compare(compare_settings(model_dir, out, presses=["recency", "none"], keep_fractions=fractions),
                        show_progress=False)
        assert (out / "results.jsonl").read_bytes() == kept
    # the new version's rows in a store of their own, then pooled by hand: verify refuses naming both codes
    other = tmp_path / "other"
    new = run_compare(compare_settings(model_dir, other, presses=["recency", "none"], keep_fractions=[0.6]),
                      show_progress=False).rows
    second = {r["method_code"] for r in new if r["press"] == "recency"}
    assert second and second != first
    pooled = tmp_path / "pooled"
    pooled.mkdir()
    (pooled / "results.jsonl").write_bytes(kept + b"".join(json.dumps(r).encode() + b"\n" for r in new
                                                           if r["press"] == "recency"))
    code, err = run_cli(capsys, "verify", pooled)
    assert code == 2 and "recency/flat" in err and "two versions of its own code" in err, err


def test_a_new_press_joins_a_group_by_running_only_its_rows(user_press, model_dir, tmp_path, capsys):
    out = tmp_path / "store"
    run_compare(compare_settings(model_dir, out, keep_fractions=[0.3]), show_progress=False)
    before = ResultStore(out, readonly=True).rows
    user_press(-1)
    run_compare(compare_settings(model_dir, out, presses=["recency", "keydiff", "none"], keep_fractions=[0.3]),
                show_progress=False)
    after = ResultStore(out, readonly=True).rows
    assert after[:len(before)] == before  # nothing rewritten, and the others' rows are not computed again
    assert {r["press"] for r in after[len(before):]} == {"recency"}
    code, err = run_cli(capsys, "verify", out)
    assert code == 0, err
    code, _ = run_cli(capsys, "leaderboard", out, "--out", tmp_path / "docs")
    board = (tmp_path / "docs" / "leaderboard.md").read_text()
    assert code == 0 and "recency/flat" in board and "keydiff/flat" in board


PACKAGE = {
    "recency_pkg/__init__.py": "SIGN = -1\n" + RECENCY.replace("@presses.register\n", ""),
    "recency_pkg-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: recency-pkg\nVersion: 0.1\n",
    "recency_pkg-0.1.dist-info/entry_points.txt": "[hybridpress.presses]\nrecency = recency_pkg:RecencyPress\n",
}


@pytest.mark.slow  # ~14 s: a process with two workers; CI's slow run holds it
def test_a_press_of_an_installed_package_runs_from_bench_compare(model_dir, tmp_path):
    """The package declares its press as an entry point and nothing imports it: ``bench compare`` finds it by name,
    in its worker processes too."""
    site = tmp_path / "site"
    for name, text in PACKAGE.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    command = [sys.executable, "-m", "bench.entry", "compare", "--methods", "recency/flat", "--keep-fractions", "0.3",
               "--tasks", "niah_single_1", "--n", "2", "--length", "300", "--model", str(model_dir), "--jobs", "2",
               "--out", str(tmp_path / "out")]
    env = {"PYTHONPATH": f"{site}:{bench.store.project_modules.ROOT}", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = ResultStore(tmp_path / "out", readonly=True).rows
    assert {(r["press"], r["allocator"]) for r in rows} == {("recency", "flat"), ("none", "none")}
    assert len({r["item"] for r in rows}) == 2


def test_import_names_a_users_module_for_bench_compare(model_dir, tmp_path, monkeypatch, capsys):
    (tmp_path / "my_recency.py").write_text("SIGN = -1\n" + RECENCY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(registry, "PRESSES", dict(registry.PRESSES))
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        argv = ["compare", "--methods", "recency/flat", "--keep-fractions", "0.3", "--tasks", "niah_single_1", "--n",
                "1", "--length", "300", "--model", model_dir, "--out", tmp_path / "out"]
        code, err = run_cli(capsys, *argv)
        assert code == 2 and "unknown press 'recency'" in err, err
        code, err = run_cli(capsys, *argv, "--import", "my_recency")
        assert code == 0, err
        code, err = run_cli(capsys, *argv, "--import", "no_such_module")
        assert code == 2 and "--import no_such_module: No module named 'no_such_module'" in err, err
    finally:
        sys.modules.pop("my_recency", None)


def _compare_with_imported_press(name, source, model_dir, tmp_path, monkeypatch, capsys):
    """``bench compare --methods recency/flat --import name`` with ``source`` as that module in ``tmp_path``."""
    (tmp_path / f"{name}.py").write_text("SIGN = -1\n" + source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(registry, "PRESSES", dict(registry.PRESSES))
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        return run_cli(capsys, "compare", "--methods", "recency/flat", "--keep-fractions", "0.3", "--tasks",
                       "niah_single_1", "--n", "1", "--length", "300", "--model", model_dir, "--out",
                       tmp_path / "out", "--import", name)
    finally:
        sys.modules.pop(name, None)


@pytest.mark.parametrize("edit, says", [
    ("scores[first] = scores[first] * float('nan')", "give layer {first} NaN or infinite values"),
    ("scores[first] = scores[first][:, :5]", "give layer {first} the shape [{heads}, 5]"),
    ("del scores[first]", "have no entry for attention layer {first}"),
    ("scores = list(scores.values())", "are a list, not {{attention layer: tensor}}"),
])
def test_a_users_press_returning_bad_scores_is_named_in_one_line(model_dir, tmp_path, monkeypatch, capsys, edit,
                                                                says):
    """Probe 10: a ``--import``ed press whose scores were NaN, infinite, of the wrong shape or missing a layer ended
    in a full traceback through the bench's own ``ValueError``, which did not name the press."""
    scoring = RECENCY.replace("        return {layer:", "        scores = {layer:").replace(
        "for layer in context.adapter.attention_layers}", "for layer in context.adapter.attention_layers}\n"
        "        first = context.adapter.attention_layers[0]\n        " + edit + "\n        return scores")
    from pretrained.model_files import read_config
    config = read_config(model_dir)
    first = next(i for i, kind in enumerate(config["layer_types"]) if kind == "full_attention")
    code, err = _compare_with_imported_press("bad_recency", scoring, model_dir, tmp_path, monkeypatch, capsys)
    said = f"press recency returned scores that {says.format(first=first, heads=config['num_key_value_heads'])}"
    assert code == 2 and said in err.splitlines()[-1] and "Traceback" not in err, err
    assert "a press scores each attention layer's body with a finite tensor [H_kv, n_body]" in err, err


@pytest.mark.parametrize("status", [0, 3])
def test_a_users_press_that_calls_sys_exit_is_named_in_one_line(model_dir, tmp_path, monkeypatch, capsys, status):
    """Probe 11: a ``--import``ed press calling ``sys.exit`` in ``score`` ended the run with that status, no rows and
    nothing said; it is refused as importing such a module is, exit status 2."""
    exiting = RECENCY.replace("        return {layer:", f"        import sys\n        sys.exit({status})\n"
                              "        return {layer:")
    code, err = _compare_with_imported_press("exit_recency", exiting, model_dir, tmp_path, monkeypatch, capsys)
    said = (f"press recency called sys.exit({status}) in score; a press or allocator the bench runs returns its "
            "result and never ends the process")
    assert code == 2 and said in err.splitlines()[-1] and "Traceback" not in err, err


def test_an_entry_point_naming_another_class_is_refused(tmp_path, monkeypatch):
    site = tmp_path / "site"
    for name, text in PACKAGE.items():
        text = text.replace("recency = ", "oldest = ")
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry, "PRESSES", dict(registry.PRESSES))
    importlib.invalidate_caches()
    assert "oldest" in presses.available()
    with pytest.raises(UsageError, match=textwrap.shorten("names the class RecencyPress, whose name is 'recency'",
                                                          200)):
        presses.get("oldest")
    sys.modules.pop("recency_pkg", None)


@pytest.mark.slow  # ~3 s: two runs on a copy of the model; CI's slow run holds it
def test_an_allocators_own_calibration_is_its_method_code_not_the_groups(model_dir, tmp_path, capsys):
    """Calibrating head shares for a model (allocators' ``model_files``) changes neither the model's artifacts nor
    any other method's rows: keydiff/flat's rows stay where they are, head_shares' rows join the group, and shares
    calibrated again re-version head_shares' rows alone."""
    from allocators.head_shares import FILE
    from pretrained import loading

    copy = tmp_path / "model"
    shutil.copytree(model_dir, copy)
    (copy / FILE).unlink()
    out = tmp_path / "store"
    artifacts = loading.identity(copy).artifacts
    run_compare(compare_settings(copy, out, presses=[], allocators=[], pairs=["keydiff/flat"]), show_progress=False)
    first = ResultStore(out, readonly=True).rows
    shutil.copy(model_dir / FILE, copy / FILE)
    assert loading.identity(copy).artifacts == artifacts
    run_compare(compare_settings(copy, out, presses=[], allocators=[], pairs=["keydiff/flat", "keydiff/head_shares"]),
                show_progress=False)
    joined = ResultStore(out, readonly=True).rows
    assert joined[:len(first)] == first and {(r["press"], r["allocator"]) for r in joined[len(first):]} == {
        ("keydiff", "head_shares")}
    # shares calibrated again: another version of head_shares' own code, refused beside its rows
    record = json.loads((copy / FILE).read_text())
    record["by_keep_fraction"] = {p: {layer: list(reversed(heads)) for layer, heads in shares.items()}
                                  for p, shares in record["by_keep_fraction"].items()}
    (copy / FILE).write_text(json.dumps(record))
    code, err = run_cli(capsys, "compare", "--model", copy, "--methods", "keydiff/head_shares", "--tasks",
                        "niah_single_1", "--n", "1", "--length", "300", "--keep-fractions", "0.5", "--out", out)
    assert code == 2 and "keydiff/head_shares" in err and "another version of its own code" in err, err


def test_the_model_artifacts_left_out_of_the_group_are_the_allocators_own():
    from pretrained.model_files import METHOD_ARTIFACTS

    assert set(METHOD_ARTIFACTS) == {f for cls in allocators.ALLOCATORS.values() for f in cls.model_files}


@pytest.mark.slow  # workers
def test_an_imported_press_whose_class_names_another_module_runs_in_workers(model_dir, tmp_path, monkeypatch, capsys):
    """Probe 11: a press an ``--import``ed module registered from a class made with ``type()`` over an ABC (its
    ``__module__`` is ``abc``) was an unknown press under ``--jobs 2``: the workers imported the classes' modules
    alone, not the ``--import``ed ones."""
    made = (RECENCY.replace("@presses.register\n", "")
            + "\npresses.register(type(RecencyPress)('Made', (RecencyPress,), {}))\n")
    (tmp_path / "made_recency.py").write_text("SIGN = -1\n" + made)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(registry, "PRESSES", dict(registry.PRESSES))
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        code, err = run_cli(capsys, "compare", "--methods", "recency/flat", "--keep-fractions", "0.3", "--tasks",
                            "niah_single_1", "--n", "2", "--jobs", "2", "--length", "300", "--model", model_dir,
                            "--out", tmp_path / "out", "--import", "made_recency")
        assert registry.PRESSES["recency"].__module__ == "abc"
    finally:
        sys.modules.pop("made_recency", None)
    assert code == 0, err
    rows = ResultStore(tmp_path / "out", readonly=True).rows
    assert {r["press"] for r in rows} == {"recency", "none"} and len({r["item"] for r in rows}) == 2

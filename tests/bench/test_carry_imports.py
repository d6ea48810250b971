"""``bench carry --import MODULE``: a group holding a press of one's own module (run with ``compare --import``) is
carried once that module registers it, and without it is refused before any context is rerun, naming the press and
the flag (probe 15, U2: it stopped after loading the model, at an unknown press)."""

import sys

import pytest

import bench.run.carry
import bench.run.plan
from bench.run.compare import run_compare
from bench.store.code_version import code_version
from bench.store.result_store import ResultStore
from presses import registry
from tests.helpers import compare_settings, run_cli

MODULE = '''
from dataclasses import dataclass

import presses
from presses.keydiff import KeyDiffPress


@presses.register
@dataclass
class CarriedPress(KeyDiffPress):
    """keydiff, under a name of the user's own module."""

    name = "carriedp"
'''


@pytest.fixture
def old_store(model_dir, tmp_path, monkeypatch):
    """A store of an earlier code whose group holds the press ``carriedp`` of the module ``carried_press`` (in the
    current directory), which the run imported and this process has not."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "carried_press.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import carried_press  # noqa: F401 - registers the press, as compare --import did

    out = tmp_path / "store"
    with monkeypatch.context() as patch:
        patch.setattr(bench.run.plan, "code_version", lambda engine="hf": "01d0c0de0000")
        run_compare(compare_settings(model_dir, out, presses=["carriedp", "none"]), show_progress=False)
    registry.PRESSES.pop("carriedp")
    sys.modules.pop("carried_press")
    yield out
    registry.PRESSES.pop("carriedp", None)
    sys.modules.pop("carried_press", None)


@pytest.mark.slow  # ~4 s: a carry; CI's slow run holds it
def test_a_group_of_a_press_of_one_s_own_module_is_carried_with_import(old_store, model_dir, capsys):
    code, err = run_cli(capsys, "carry", old_store, "--sample", "1", "--model", model_dir, "--import", "carried_press")
    assert code == 0, err
    assert {r["code"] for r in ResultStore(old_store, readonly=True).rows} == {code_version()}


def test_without_the_module_the_press_is_named_before_any_context_is_rerun(old_store, model_dir, capsys,
                                                                          monkeypatch):
    kept = (old_store / "results.jsonl").read_bytes()
    monkeypatch.setattr(bench.run.carry, "_rerun", lambda *a, **k: pytest.fail("a context was rerun"))
    code, err = run_cli(capsys, "carry", old_store, "--sample", "1", "--model", model_dir)
    assert code == 2 and err.endswith(
        f"{old_store}: its group's method carriedp/flat names the press 'carriedp', which is not registered here: a "
        "press of your own module is registered by importing it, as the run that wrote the group did: give that "
        "module with --import MODULE"), err
    assert (old_store / "results.jsonl").read_bytes() == kept


def test_two_modules_are_imported_by_two_flags(model_dir, tmp_path, capsys, monkeypatch):
    """Probe 22, #1: ``--import`` is repeatable, but a second one was refused as a flag given twice."""
    monkeypatch.chdir(tmp_path)
    for module, name in (("mod_a", "pressa"), ("mod_b", "pressb")):
        (tmp_path / f"{module}.py").write_text(MODULE.replace("CarriedPress", f"Press{name[-1].upper()}")
                                               .replace('"carriedp"', repr(name)))
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        code, err = run_cli(capsys, "compare", "--model", model_dir, "--out", tmp_path / "out", "--import", "mod_a",
                            "--import", "mod_b", "--methods", "pressa/flat,pressb/flat", "--keep-fractions", "0.5",
                            "--tasks", "niah_single_1", "--n", "1", "--length", "300")
    finally:
        for name in ("pressa", "pressb"):
            registry.PRESSES.pop(name, None)
    assert code == 0, err
    assert {row["press"] for row in ResultStore(tmp_path / "out", readonly=True).rows} == {"none", "pressa", "pressb"}

"""``bench carry`` of a group whose label an older bench wrote: before a text option's ``%`` was shown as ``%25``
(b9e8e9e), ``tag=50% off`` was written as it is. Such a label reads back as no method this bench can rerun (``50% off``
starts no escape; ``a%41`` would rerun as ``aA``): carry refuses it before any context is rerun, naming the stored
label, why it does not read back and what to do, not a ``--methods`` flag the user never gave (probe 16, U1)."""

from dataclasses import dataclass

import pytest

import bench.run.carry
import bench.run.plan
import presses
from bench.run.compare import run_compare
from bench.store import label_read_back
from presses.keydiff import KeyDiffPress
from tests.helpers import compare_settings, run_cli


@dataclass
class TaggedPress(KeyDiffPress):
    """keydiff, with a text option that changes nothing."""

    name = "taggedk"
    tag: str = "x"


@pytest.fixture
def tagged(monkeypatch):
    monkeypatch.setitem(presses.PRESSES, TaggedPress.name, TaggedPress)


def _relabelled(store, model_dir, monkeypatch, tag: str) -> bytes:
    """A run of taggedk into ``store`` at an old code, its rows relabelled with the text ``tag``, and no context let
    rerun by carry; the store's bytes."""
    with monkeypatch.context() as patch:
        patch.setattr(bench.run.plan, "code_version", lambda engine="hf": "01d0c0de0000")
        run_compare(compare_settings(model_dir, store, presses=["taggedk[tag=placeholder]", "none"]),
                    show_progress=False)
    rows = (store / "results.jsonl").read_text()
    assert "taggedk(tag=placeholder)" in rows
    (store / "results.jsonl").write_text(rows.replace("tag=placeholder", f"tag={tag}"))
    monkeypatch.setattr(bench.run.carry, "_rerun", lambda *a, **k: pytest.fail("a context was rerun"))
    return (store / "results.jsonl").read_bytes()


@pytest.mark.parametrize(("old", "why"), [
    ("50% off", "the '%' at character 3 starts no %XX escape"),
    ("a%41", "read as escapes it is 'aA', which this bench shows as 'aA'"),
])
def test_a_label_an_older_bench_wrote_is_named_before_any_context_is_rerun(tagged, old, why, model_dir, tmp_path,
                                                                           capsys, monkeypatch):
    store = tmp_path / "store"
    kept = _relabelled(store, model_dir, monkeypatch, old)  # as the older bench wrote it: '%' and all
    code, err = run_cli(capsys, "carry", store, "--sample", "1", "--model", model_dir)
    label = f"taggedk(tag={old})"
    assert code == 2 and err == (
        f"bench carry: error: {store}: its group's method {label}/flat: the label {label!r} cannot be read back: its "
        f"tag {old!r} is no text this bench shows ({why}). If tag is a text option, an older bench wrote it, which "
        "took a '%' in a text as itself (this one reads %XX as an escape and shows '%' as %25); if not, it was "
        "written by hand or by another tool, so its rows name no method a rerun here could match: rerun that method "
        "into a store of its own (bench compare --methods, each '%' of its text written %25), and carry the rest of "
        "the group without these rows (move them out)"), err
    assert (store / "results.jsonl").read_bytes() == kept


def test_a_label_naming_its_setting_otherwise_is_named_before_any_context_is_rerun(tagged, model_dir, tmp_path,
                                                                                   capsys, monkeypatch):
    """Probe 18, #3: a registered press's label naming an option at its default reads back as text; carry rebuilt
    its setting only by rerunning it, and then blamed the code. A user's press: its module may have changed since
    (probe 21, U1). It asks the setting's check itself, whether or not
    the bench command has handed it to the store's readers."""
    store = tmp_path / "store"
    kept = _relabelled(store, model_dir, monkeypatch, "x")  # its default, named
    monkeypatch.setattr(label_read_back, "_setting_check", None)  # as for a library caller
    code, err = run_cli(capsys, "carry", store, "--sample", "1", "--model", model_dir)
    assert code == 2 and err.startswith(
        f"bench carry: error: {store}: its group's method taggedk(tag=x)/flat: the label 'taggedk(tag=x)' cannot be "
        f"read back: taggedk as its module {__name__} is imported here shows that setting as 'taggedk': the module "
        "changed since the label was written (a default or an option), or the label was written by hand, so its rows "
        "name no method a rerun here could match: rerun that method"), err
    assert (store / "results.jsonl").read_bytes() == kept

"""Issue 64's unclear messages, each now one line that says what is wrong and what to do: a store's lock that is a
folder, a merge into a committed store that names the file it really holds, the press a ``global`` refusal names,
``--out /dev/null`` (in test_output_links.py)."""

import gzip
import importlib.util

import pytest

from bench.run.compare import run_compare
from tests.helpers import compare_settings, run_cli

SMALL_RUN = ["--keep-fractions", "0.5", "--tasks", "niah_single_1", "--length", "300", "--n", "1"]


@pytest.fixture(scope="module")
def store(model_dir, tmp_path_factory):
    """A finished run of the tiny model: no prune and keydiff/flat on one context."""
    out = tmp_path_factory.mktemp("store") / "store"
    run_compare(compare_settings(model_dir, out, n=1), show_progress=False)
    return out


def test_a_lock_that_is_a_folder_is_called_a_folder(model_dir, tmp_path, capsys, no_model_load):
    """``mkdir STORE/.lock`` was ".lock: one file with 2 names (a hard link …)": a folder has two links itself."""
    out = tmp_path / "out"
    (out / ".lock").mkdir(parents=True)
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--press", "keydiff", *SMALL_RUN, "--out", out)
    assert code == 2 and f"{out / '.lock'}: a folder, where a store's lock belongs" in err, err
    assert "hard link" not in err


def test_a_merge_into_a_committed_store_names_the_file_that_holds_its_rows(store, tmp_path, capsys):
    """``bench merge s0 --out DIR`` where DIR holds only ``results.jsonl.gz`` said "0 rows added to
    DIR/results.jsonl", a file it never made; it names the ``.gz`` when nothing was added, and the file it appended
    to when something was."""
    committed = tmp_path / "committed"
    committed.mkdir()
    (committed / "results.jsonl.gz").write_bytes(gzip.compress((store / "results.jsonl").read_bytes()))
    out = _printed(capsys, "merge", store, "--out", committed)
    assert f"0 rows added to {committed / 'results.jsonl.gz'}" in out and not (committed / "results.jsonl").exists()
    empty = tmp_path / "empty"
    out = _printed(capsys, "merge", store, "--out", empty)
    assert f"rows added to {empty / 'results.jsonl'}" in out and (empty / "results.jsonl").is_file(), out


def _printed(capsys, *argv) -> str:
    """What ``bench argv`` printed on standard output, once it ended 0."""
    from bench.commands.cli import main

    capsys.readouterr()
    assert main(list(map(str, argv))) == 0
    return capsys.readouterr().out


@pytest.mark.skipif(importlib.util.find_spec("kvpress") is None, reason="kvpress is not installed")
def test_a_kvpress_scorer_under_global_is_named_as_given(model_dir, tmp_path, capsys, no_model_load):
    """``kvpress:KnormPress/global`` was refused naming "'kvpress'": the refusal names the scorer as given and says
    what is wrong with its scores."""
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--methods", "kvpress:KnormPress/global",
                        *SMALL_RUN, "--out", tmp_path / "out")
    assert code == 2 and "but kvpress:KnormPress scores each layer on a scale of its own" in err, err
    assert "'kvpress'" not in err


@pytest.mark.parametrize("given", [("--methods", "kvzip[tokenizer=x]/flat"),
                                   ("--methods", "kvzip/flat", "--press-options", "tokenizer=x")])
def test_a_field_the_run_sets_is_no_option(model_dir, tmp_path, capsys, no_model_load, given):
    """Probe 24, #3: KVzip's ``tokenizer`` was taken as text and the run failed in a traceback after the model
    loaded; the run hands the press the model's own, so the option is refused, in one line, before any work."""
    code, err = run_cli(capsys, "compare", "--model", model_dir, *given, *SMALL_RUN, "--out", tmp_path / "out")
    assert code == 2 and "kvzip: tokenizer is the model's own, which the run hands the press" in err, err
    assert "\n" not in err.strip() and not (tmp_path / "out").exists()

"""Every child is measured against the no-prune row of its question (probe 14, #4): a store whose no-prune rows were
deleted passed ``bench verify``, whose message says it checked every child's ΔNLL, so a hand-set ΔNLL of 0 passed and
the leaderboard showed it. A run writes a context's no-prune rows before its children, so a child without one never
came from a run: it is named by its context and question. A method that joins a collection's group by its own rows
finds them in the group's ``none`` store."""

import gzip
import json

import pytest

from bench.run.compare import run_compare
from tests.helpers import assert_reports_refuse, compare_settings, run_cli, store_of, stored_rows


@pytest.fixture(scope="module")
def run(model_dir, tmp_path_factory):
    """A finished run of the tiny model: no prune and keydiff/flat on two contexts."""
    out = tmp_path_factory.mktemp("run")
    run_compare(compare_settings(model_dir, out, n=2), show_progress=False)
    return out


@pytest.mark.parametrize("removed", ["every no-prune row", "the no-prune row of item 1"])
def test_children_without_their_no_prune_row_are_refused(run, tmp_path, capsys, removed):
    item = 0 if removed == "every no-prune row" else 1
    gone = [row for row in stored_rows(run) if row["press"] == "none" and row["item"] >= item]
    # what the deleted rows would have caught: their children's ΔNLL and KL set to 0 by hand
    kept = [dict(row, delta_nll=0.0, kl=0.0) if row["item"] >= item else row for row in stored_rows(run)
            if row not in gone]
    bad = store_of(kept, tmp_path / "bad")
    assert_reports_refuse(capsys, bad, tmp_path / "docs", (
        f"{bad / 'results.jsonl'} is incomplete: the no-prune row of task niah_single_1, item {item}, question 0 is "
        "missing, against which its children's ΔNLL and KL were measured; every run writes a context's no-prune rows "
        "before its children, so they were removed after it: restore the store from its run's own copy, or rerun it "
        "into a store of its own"))
    code, err = run_cli(capsys, "merge", bad, "--out", tmp_path / "merged")
    assert code == 2 and "the no-prune row of task niah_single_1" in err, err


def test_children_are_checked_against_the_no_prune_rows_of_another_store(run, tmp_path, capsys):
    """A collection keeps a method's children in a store of their own, its group's no-prune rows in the ``none``
    store, and each store's rows were checked alone: a ΔNLL set to 0 by hand in a method's pack passed verify. The
    children are checked against the no-prune rows of every store given (or of the collection) together."""
    rows = stored_rows(run)
    children = store_of([row for row in rows if row["press"] != "none"], tmp_path / "children")
    fulls = store_of([row for row in rows if row["press"] == "none"], tmp_path / "fulls")
    assert run_cli(capsys, "verify", children, fulls)[0] == 0
    edited = store_of([dict(row, delta_nll=0.0) for row in rows if row["press"] != "none"], tmp_path / "edited")
    code, err = run_cli(capsys, "verify", edited, fulls)
    assert code == 2 and f"{edited / 'results.jsonl'}:1: delta_nll=0.0 (expected answer_nll " in err, err
    collection = tmp_path / "results"
    assert run_cli(capsys, "publish", run, "--into", collection)[0] == 0
    assert run_cli(capsys, "verify", collection)[0] == 0
    [pack] = [path for path in collection.rglob("results.jsonl.gz") if path.parent.name == "keydiff--flat"]
    packed = [json.loads(line) for line in gzip.decompress(pack.read_bytes()).splitlines()]
    pack.write_bytes(gzip.compress("".join(json.dumps(dict(row, delta_nll=0.0)) + "\n" for row in packed).encode()))
    code, err = run_cli(capsys, "verify", collection)
    assert code == 2 and f"{pack}:1: delta_nll=0.0 (expected answer_nll " in err, err


def test_a_collections_method_store_needs_no_no_prune_rows_of_its_own(run, tmp_path, capsys):
    """Probe 15: a published method's store holds its children alone (its group's no-prune rows are the ``none``
    store), so it was refused as rows removed — given alone to verify, leaderboard or merge, and in ``bench merge`` of
    its whole collection, which checks each store it joins alone."""
    collection = tmp_path / "results"
    assert run_cli(capsys, "publish", run, "--into", collection)[0] == 0
    [method] = [path.parent for path in collection.rglob("results.jsonl.gz") if path.parent.name == "keydiff--flat"]
    code, err = run_cli(capsys, "verify", method)
    assert code == 0, err
    code, err = run_cli(capsys, "merge", collection, "--out", tmp_path / "merged")
    assert code == 0, err
    assert sorted(map(json.dumps, stored_rows(tmp_path / "merged"))) == sorted(map(json.dumps, stored_rows(run)))
    # a plain store of the same children alone is still refused: no run writes one
    packed = [json.loads(line) for line in gzip.decompress((method / "results.jsonl.gz").read_bytes()).splitlines()]
    code, err = run_cli(capsys, "verify", store_of(packed, tmp_path / "plain"))
    assert code == 2 and "the no-prune row of task niah_single_1, item 0, question 0 is missing" in err, err

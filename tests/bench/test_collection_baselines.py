"""A collection's method store holds its children alone, measured against the no-prune rows of its group's ``none``
store (probe 16, #1): a group whose ``none`` store was deleted, or that lacks a child's no-prune row, passed ``bench
verify`` with its children's ΔNLL edited, and a method's store published alone into a new collection made a group of
no baseline. Each is refused by verify, the leaderboard and publish, naming the group and what it lacks."""

import gzip
import json
import shutil

import pytest

from bench.run.compare import run_compare
from tests.helpers import assert_reports_refuse, compare_settings, run_cli


@pytest.fixture(scope="module")
def run(model_dir, tmp_path_factory):
    """A finished run of the tiny model: no prune and keydiff/flat on two contexts."""
    out = tmp_path_factory.mktemp("run")
    run_compare(compare_settings(model_dir, out, n=2), show_progress=False)
    return out


def _published(run, tmp_path, capsys):
    """The run published into a new collection, and its one group's folder."""
    collection = tmp_path / "results"
    code, err = run_cli(capsys, "publish", run, "--into", collection)
    assert code == 0, err
    [group] = collection.iterdir()
    return collection, group


def _rows(pack):
    return [json.loads(line) for line in gzip.decompress(pack.read_bytes()).splitlines()]


def _rewrite(pack, change):
    """``pack``'s rows, each passed through ``change`` (None drops it), written back."""
    rows = [change(row) for row in _rows(pack)]
    pack.write_bytes(gzip.compress("".join(json.dumps(row) + "\n" for row in rows if row is not None).encode()))


def _files(folder):
    return {path: path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("removed", ["the none store", "the no-prune row of item 1"])
def test_a_group_without_its_children_s_no_prune_rows_is_refused(run, tmp_path, capsys, removed):
    collection, group = _published(run, tmp_path, capsys)
    if removed == "the none store":
        shutil.rmtree(group / "none")
        lacks = (f"{group}: the setting group of the collection {collection} holds the children of keydiff/flat "
                 f"but no none store ({group / 'none' / 'results.jsonl.gz'}), whose no-prune rows every child's ΔNLL "
                 "and KL are measured against")
    else:
        _rewrite(group / "none" / "results.jsonl.gz", lambda row: None if row["item"] == 1 else row)
        [code] = {row["code"] for row in _rows(group / "none" / "results.jsonl.gz")}
        lacks = (f"{group / 'keydiff--flat' / 'results.jsonl.gz'}:2: a child of keydiff/flat whose no-prune row "
                 f"(task niah_single_1, item 1, question 0, code {code}) {group / 'none' / 'results.jsonl.gz'} does "
                 "not hold, against which its ΔNLL and KL were measured")
    # what the missing rows would have caught: the children's ΔNLL and KL edited by hand
    _rewrite(group / "keydiff--flat" / "results.jsonl.gz", lambda row: dict(row, delta_nll=-5.0, kl=0.0))
    assert_reports_refuse(capsys, collection, tmp_path / "docs", lacks)
    code, err = run_cli(capsys, "verify", group / "keydiff--flat")
    assert code == 2 and lacks in err, err


def test_a_method_store_alone_is_checked_against_its_groups_none_store(run, tmp_path, capsys):
    """Given alone (without the collection), a method's store is held to the ``none`` store beside it."""
    collection, group = _published(run, tmp_path, capsys)
    assert run_cli(capsys, "verify", group / "keydiff--flat")[0] == 0
    pack = group / "keydiff--flat" / "results.jsonl.gz"
    _rewrite(pack, lambda row: dict(row, delta_nll=0.0))
    code, err = run_cli(capsys, "verify", group / "keydiff--flat")
    assert code == 2 and f"{pack}:1: delta_nll=0.0 (expected answer_nll " in err, err


def test_a_method_store_published_alone_into_a_new_collection_is_refused(run, tmp_path, capsys):
    """A collection's method store holds no no-prune rows (its group's are the ``none`` store beside it), so it
    cannot make a group alone; published with that ``none`` store it can."""
    collection, group = _published(run, tmp_path, capsys)
    other = tmp_path / "other"
    code, err = run_cli(capsys, "publish", group / "keydiff--flat", "--into", other)
    assert code == 2 and f"{other / group.name}: the setting group of the collection {other} holds the children of " \
                          "keydiff/flat but no none store" in err, err
    assert not other.exists()
    code, err = run_cli(capsys, "publish", group / "none", group / "keydiff--flat", "--into", other)
    assert code == 0, err
    assert _files(other) == {other / path.relative_to(collection): data for path, data in _files(collection).items()}
    assert run_cli(capsys, "verify", other)[0] == 0

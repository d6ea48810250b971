"""``bench publish`` into a carried group (probe 16, #3): a collection's group carried from code A to B reads its
files' rows under B (``carried.json``), and publish compared a store's rows of A by their raw code, so a store made
before the carry wrote a second no-prune row beside the carried one, and the collection then failed verify. Publish
reads incoming rows as the collection will (carried codes mapped), checks the collection with each group's record,
and refuses rows of a method the carry did not cover at the code it carried the group from."""

import gzip
import json
import shutil

import pytest

import bench.run.plan
from bench.run.compare import run_compare
from bench.store.carried_codes import CARRIED
from bench.store.code_version import code_version
from tests.helpers import compare_settings, run_cli

OLD = "01d0c0de0000"  # a code as the bench writes one: 12 hex digits (a record names it)


def _at_old_code(model_dir, out, **change):
    """A run whose rows name the code :data:`OLD` (an earlier checkout's)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bench.run.plan, "code_version", lambda engine="hf": OLD)
        run_compare(compare_settings(model_dir, out, **change), show_progress=False)
    return out


@pytest.fixture(scope="module")
def old_runs(model_dir, tmp_path_factory):
    """Two runs at the earlier code on the same contexts: keydiff, and (another method) snapkv."""
    folder = tmp_path_factory.mktemp("old")
    return (_at_old_code(model_dir, folder / "keydiff", n=2),
            _at_old_code(model_dir, folder / "snapkv", n=2, presses=["snapkv", "none"]))


def _files(folder):
    return {path: path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def test_a_store_of_a_groups_pre_carry_code_is_read_as_the_collection_reads_it(old_runs, model_dir, tmp_path,
                                                                              capsys):
    keydiff, snapkv = old_runs
    collection = tmp_path / "results"
    assert run_cli(capsys, "publish", keydiff, "--into", collection)[0] == 0
    [group] = collection.iterdir()
    code, err = run_cli(capsys, "carry", group, "--sample", "1", "--model", model_dir)
    assert code == 0, err
    assert json.loads((group / CARRIED).read_text())[0]["from"] == OLD
    before = _files(collection)
    # the same store again, of the code the group was carried from: every row is there already, read under the new
    code, err = run_cli(capsys, "publish", keydiff, "--into", collection)
    assert code == 0 and "new row(s)" not in err, err
    assert _files(collection) == before
    assert run_cli(capsys, "verify", collection)[0] == 0
    # a method the carry did not cover, of that code: refused, naming the carry, before anything is written
    code, err = run_cli(capsys, "publish", snapkv, "--into", collection)
    assert code == 2 and err == (
        f"bench publish: error: {snapkv}: the row of snapkv/flat at p=0.5, task niah_single_1, item 0, question 0 is "
        f"of code {OLD}, from which {group} was carried to code {code_version()} ({group / CARRIED}), and the carry "
        "did not cover it (its method was not in the group then): carry the store to this checkout's code (bench "
        f"carry {snapkv}), or rerun it here, then publish it"), err
    assert _files(collection) == before
    # put there by hand, its children are read under their old code, and their no-prune rows under the new one
    copy = tmp_path / "copy"
    shutil.copytree(collection, copy)
    pack = copy / group.name / "snapkv--flat" / "results.jsonl.gz"
    pack.parent.mkdir()
    lines = (snapkv / "results.jsonl").read_text().splitlines()
    pack.write_bytes(gzip.compress("".join(line + "\n" for line in lines if '"press": "snapkv"' in line).encode()))
    code, err = run_cli(capsys, "verify", copy)
    assert code == 2 and f"{pack}:1: a child of snapkv/flat whose no-prune row (task niah_single_1, item 0, " \
                         f"question 0, code {OLD}) {copy / group.name / 'none' / 'results.jsonl.gz'} does not hold" \
                         in err, err
    # the same method at this code joins the carried group as its own file
    new = tmp_path / "new"
    shutil.copytree(snapkv, new)
    rows = [json.loads(line) for line in (new / "results.jsonl").read_text().splitlines()]
    (new / "results.jsonl").write_text("".join(json.dumps(dict(row, code=code_version())) + "\n" for row in rows))
    code, err = run_cli(capsys, "publish", new, "--into", collection)
    assert code == 0, err
    assert {p: b for p, b in _files(collection).items() if p in before} == before
    assert (group / "snapkv--flat").is_dir() and run_cli(capsys, "verify", collection)[0] == 0

"""The stores ``bench verify``, ``leaderboard`` and ``merge`` read, and the leaderboard they publish: a store argument
is a directory holding a store, never read as empty when it is not one, nor while a writer holds it; a leaderboard
built again leaves none of its earlier tables or images behind, and ``bench verify --docs`` refuses one it does not
list."""

import json

import pytest

from bench.reports.leaderboard import MANIFEST, read_manifest
from bench.run.compare import CompareSettings, run_compare
from tests.bench.test_store import held_by_a_writer
from tests.helpers import run_cli

READERS = [["verify"], ["leaderboard", "--out", "{tmp}/docs"], ["merge", "--out", "{tmp}/merged"]]
"""Every command that reads stores, with what else it is given."""


@pytest.fixture(scope="module")
def store(model_dir, tmp_path_factory):
    """A finished run of the tiny model: no prune and keydiff/flat at p = 0.5 on one context."""
    out = tmp_path_factory.mktemp("run")
    run_compare(CompareSettings(presses=["keydiff", "none"], allocators=["flat"], keep_fractions=[0.5],
                                tasks=["niah_single_1"], n=1, length=300, model=str(model_dir), out=out),
                show_progress=False)
    return out


def _argv(reader: list[str], stores, tmp) -> list[str]:
    return [reader[0], *map(str, stores), *(part.format(tmp=tmp) for part in reader[1:])]


@pytest.mark.parametrize("reader", READERS, ids=lambda reader: reader[0])
@pytest.mark.parametrize("given, named", [
    ("typo", "{given}: no such directory"),
    ("file", "{given} is a file: give the store's directory, here {store}"),
    ("empty", "{given} holds no results.jsonl (nor results.jsonl.gz)"),
])
def test_a_store_argument_that_is_no_store_is_named(store, tmp_path, capsys, reader, given, named):
    """Beside a real store, a typo, the store's results.jsonl or a directory without one is one line naming it,
    never read as a store without rows; nothing is written."""
    place = {"typo": tmp_path / "typo", "file": store / "results.jsonl", "empty": tmp_path / "empty"}[given]
    (tmp_path / "empty").mkdir()
    stores = [place] if given == "file" else [store, place]
    code, err = run_cli(capsys, *_argv(reader, stores, tmp_path))
    assert code == 2 and named.format(given=place, store=store) in err, err
    assert not (tmp_path / "docs").exists() and not (tmp_path / "merged").exists()


@pytest.mark.parametrize("reader", READERS, ids=lambda reader: reader[0])
@pytest.mark.parametrize("depth", [3, 4])
def test_a_folder_with_a_store_further_down_names_it(store, tmp_path, capsys, reader, depth):
    """Probe 19, U3: a folder holding a collection (``up/c``) or a store deeper still was called no store, naming
    neither; the first store below is named, with the collection it would be in."""
    up = tmp_path / "up"
    below = up.joinpath(*["deep"] * (depth - 3), "c", "m-300-0123456789", "method")  # depth folders below up
    below.mkdir(parents=True)
    (below / "results.jsonl").write_bytes((store / "results.jsonl").read_bytes())
    code, err = run_cli(capsys, *_argv(reader, [up], tmp_path))
    assert code == 2 and f"{up} holds no results.jsonl (nor results.jsonl.gz): it is not a result store (a store " \
        f"lies below it, {below}: give that store, or the collection it is in, {below.parent.parent}, as a " \
        "collection holds its stores at <group>/<method>/)" in err, err
    assert not (tmp_path / "docs").exists() and not (tmp_path / "merged").exists()


@pytest.mark.parametrize("reader", READERS, ids=lambda reader: reader[0])
@pytest.mark.parametrize("folders", [["runs"], ["runs", "x"]])
def test_a_folder_of_runs_is_no_collection(store, tmp_path, capsys, reader, folders):
    """Probe 22, U2: a folder holding runs one or two folders down was called a setting group's folder of the
    collection '.', or a collection whose stores bench publish did not put there; it is neither."""
    below = tmp_path.joinpath(*folders, "S1")
    below.mkdir(parents=True)
    (below / "results.jsonl").write_bytes((store / "results.jsonl").read_bytes())
    given = tmp_path / "runs"
    code, err = run_cli(capsys, *_argv(reader, [given], tmp_path))
    said = (f"{given} holds no results.jsonl (nor results.jsonl.gz): it is not a result store (a store lies below "
            f"it, {below}: give the stores themselves)" if len(folders) == 1 else
            f"{given} holds no results.jsonl and is no collection: none of its folders is a setting group's "
            f"(<model>-<length>-<digest>), and the stores below it ({below}) are runs of their own: give them "
            "themselves")
    assert code == 2 and said in err and "collection ." not in err, err
    assert not (tmp_path / "docs").exists() and not (tmp_path / "merged").exists()


@pytest.mark.parametrize("reader", READERS, ids=lambda reader: reader[0])
def test_a_store_being_written_is_named_so(store, tmp_path, capsys, reader):
    """A store a running bench compare holds (its lock) is not called unfinished: it is being written."""
    with held_by_a_writer(store) as pid:
        code, err = run_cli(capsys, *_argv(reader, [store], tmp_path))
    assert code == 2 and f"{store} is being written by another process (pid {pid})" in err, err
    assert "stopped before finishing" not in err
    if reader[0] == "verify":  # the lock died with its process: the store is whole
        assert run_cli(capsys, "verify", store)[0] == 0


def test_a_leaderboard_built_again_leaves_no_earlier_image(store, tmp_path, capsys):
    """Two setting groups (two code versions) draw leaderboard-2.png; built again from one group, the leaderboard
    removes it (it was in the earlier manifest) and nothing else; an unlisted image there fails ``bench verify
    --docs``."""
    other = tmp_path / "other"
    other.mkdir()
    rows = [json.loads(line) for line in (store / "results.jsonl").read_text().splitlines()]
    (other / "results.jsonl").write_text("".join(json.dumps({**row, "code": row["code"][::-1]}) + "\n" for row in rows))
    docs = tmp_path / "docs"
    assert run_cli(capsys, "leaderboard", store, other, "--out", docs)[0] == 0
    assert "leaderboard-2.png" in read_manifest(docs / MANIFEST)
    (docs / "notes.txt").write_text("mine")
    assert run_cli(capsys, "leaderboard", store, "--out", docs)[0] == 0
    assert not (docs / "leaderboard-2.png").exists() and (docs / "notes.txt").read_text() == "mine"
    assert run_cli(capsys, "verify", store, "--docs", docs)[0] == 0
    (docs / "leaderboard-2.png").write_bytes((docs / "leaderboard.png").read_bytes())
    code, err = run_cli(capsys, "verify", store, "--docs", docs)
    assert code == 2 and f"{docs / 'leaderboard-2.png'} is not in {docs / MANIFEST}" in err, err


@pytest.mark.parametrize("reader", READERS, ids=lambda reader: reader[0])
def test_a_group_folder_of_a_collection_is_named_so(store, tmp_path, capsys, reader):
    """Probe 64: ``bench verify COLL/G`` said "not a result store (an empty shard …)" of a collection's
    setting-group folder; it names what the folder is and the collection to give (``bench carry`` takes one: see
    tests/bench/test_carry.py)."""
    collection = tmp_path / "collection"
    assert run_cli(capsys, "publish", store, "--into", collection)[0] == 0
    [group] = collection.iterdir()
    code, err = run_cli(capsys, *_argv(reader, [group], tmp_path))
    assert code == 2 and f"{group} is a setting group's folder of the collection {collection}" in err, err
    assert "empty shard" not in err


def test_a_carry_redraws_no_image(store, tmp_path, capsys):
    """The images are titled without the group's code, which the heading above each names: rows carried to another
    code (each value the same) draw the same bytes, so a carry commits no image again."""
    other = tmp_path / "other"
    other.mkdir()
    rows = [json.loads(line) for line in (store / "results.jsonl").read_text().splitlines()]
    (other / "results.jsonl").write_text("".join(json.dumps({**row, "code": "c0dec0dec0de"}) + "\n" for row in rows))
    for source, docs in ((store, tmp_path / "a"), (other, tmp_path / "b")):
        assert run_cli(capsys, "leaderboard", source, "--out", docs)[0] == 0
    assert "code c0dec0dec0de" in (tmp_path / "b" / "leaderboard.md").read_text()
    assert (tmp_path / "a" / "leaderboard.png").read_bytes() == (tmp_path / "b" / "leaderboard.png").read_bytes()

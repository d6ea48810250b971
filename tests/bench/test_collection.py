"""A collection of stores, one per setting group and method (``docs/results``): ``bench publish`` writes only the
files of the rows it adds, so a method joining a group adds one file and changes no other byte; ``verify`` and
``leaderboard`` read the collection as one set of rows; a row published with other values is refused."""

import gzip
import json
import shutil

import pytest

from bench.run.compare import run_compare
from bench.store.collection import group_folder, stores_below
from runtime.errors import UsageError
from tests.helpers import compare_settings, run_cli


def _files(folder):
    return {path.relative_to(folder): path.read_bytes() for path in sorted(folder.rglob("*.gz"))}


@pytest.mark.slow  # ~3 s: two runs, each published; CI's slow run holds it
def test_a_method_joining_a_group_adds_its_own_file_and_nothing_else(model_dir, tmp_path, capsys):
    first, later, collection = tmp_path / "first", tmp_path / "later", tmp_path / "results"
    run_compare(compare_settings(model_dir, first, n=2), show_progress=False)
    code, err = run_cli(capsys, "publish", first, "--into", collection)
    assert code == 0, err
    before = _files(collection)
    assert sorted(p.parent.name for p in before) == ["keydiff--flat", "none"]
    assert run_cli(capsys, "verify", collection)[0] == 0
    # the same contexts with one method more: the no-prune and keydiff rows come again, equal, and are left
    run_compare(compare_settings(model_dir, later, presses=["keydiff", "snapkv", "none"], n=2), show_progress=False)
    code, err = run_cli(capsys, "publish", later, "--into", collection)
    assert code == 0, err
    after = _files(collection)
    assert {p: b for p, b in after.items() if p in before} == before
    [new] = set(after) - set(before)
    assert new.parent.name == "snapkv--flat"
    rows = [json.loads(line) for line in gzip.decompress(after[new]).splitlines()]
    assert {r["press"] for r in rows} == {"snapkv"} and len(rows) == 2
    code, err = run_cli(capsys, "leaderboard", collection, "--out", tmp_path / "docs")
    board = (tmp_path / "docs" / "leaderboard.md").read_text()
    assert code == 0 and "snapkv/flat" in board and "keydiff/flat" in board
    assert run_cli(capsys, "verify", collection, "--docs", tmp_path / "docs")[0] == 0
    # publishing again adds nothing
    code, err = run_cli(capsys, "publish", later, "--into", collection)
    assert code == 0 and _files(collection) == after and len(stores_below(collection)) == 3


def test_a_row_published_with_other_values_is_refused_and_nothing_written(model_dir, tmp_path, capsys):
    first, collection = tmp_path / "first", tmp_path / "results"
    run_compare(compare_settings(model_dir, first), show_progress=False)
    assert run_cli(capsys, "publish", first, "--into", collection)[0] == 0
    before = _files(collection)
    lines = (first / "results.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    for row in rows:
        if row["press"] == "keydiff":
            row["answer_nll"] += 1.0
            row["delta_nll"] += 1.0
    other = tmp_path / "other"
    other.mkdir()
    (other / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, err = run_cli(capsys, "publish", other, "--into", collection)
    assert code == 2 and "with other values" in err and "keydiff/flat" in err, err
    assert _files(collection) == before
    code, err = run_cli(capsys, "publish", first, "--into", first)
    assert code == 2 and "is a result store" in err, err


@pytest.mark.slow  # ~3 s: two runs; CI's slow run holds it
def test_a_method_run_on_another_text_cannot_join(model_dir, tmp_path, capsys):
    """A method run elsewhere, on a machine whose real-text haystack is another text, is refused beside the group's
    rows: its children name another context digest than their questions' no-prune rows."""
    first, later, collection = tmp_path / "first", tmp_path / "later", tmp_path / "results"
    run_compare(compare_settings(model_dir, first), show_progress=False)
    assert run_cli(capsys, "publish", first, "--into", collection)[0] == 0
    run_compare(compare_settings(model_dir, later, presses=["snapkv", "none"]), show_progress=False)
    rows = [json.loads(line) for line in (later / "results.jsonl").read_text().splitlines()]
    for row in rows:
        row["context_sha"] = "f" * 16
    (later / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = _files(collection)
    code, err = run_cli(capsys, "publish", later, "--into", collection)
    assert code == 2 and "is another text (digest ffffffffffffffff)" in err, err
    assert _files(collection) == before


@pytest.mark.slow  # ~4 s: two runs; CI's slow run holds it
def test_a_refused_publish_names_the_collections_files_and_says_what_it_checks(model_dir, tmp_path, capsys):
    """Probe 64: publishing an n=2 run beside the n=1 run of its group was refused naming the files of a scratch copy
    (``/tmp/publish-XXXX/…``) that were gone by then; and a large collection checked for a minute with no output.
    The refusal names the collection's files and the stores given; each step is said on stderr as it starts."""
    one, two, collection = tmp_path / "one", tmp_path / "two", tmp_path / "results"
    run_compare(compare_settings(model_dir, one), show_progress=False)
    run_compare(compare_settings(model_dir, two, n=2, presses=["snapkv", "none"]), show_progress=False)
    assert run_cli(capsys, "publish", one, "--into", collection)[0] == 0
    before = _files(collection)
    capsys.readouterr()
    from bench.commands.cli import main

    code = main(["publish", str(two), "--into", str(collection)])
    err = capsys.readouterr().err
    assert code == 2 and "publish-" not in err, err
    assert f"{collection} with the rows of {two} (the new ones after its own in each file) would not verify" in err
    assert f"{collection}/{next(iter(before)).parent.parent}/" in err, err
    assert f"publish: checking {two} …" in err and f"publish: reading the 2 store(s) of {collection} …" in err, err
    assert _files(collection) == before


def test_a_model_name_of_no_ascii_letter_names_its_group_folder_model():
    """Probe 10: a model named ``é`` alone gave the group folder ``-384-<digest>``, which a shell command takes for an
    option. The folder says ``model`` in its place; the digest, of the name too, keeps two such models apart; an
    ASCII name's folder is as before."""
    one, other = group_folder({"model": "éé", "length": 384}), group_folder({"model": "ü", "length": 384})
    assert one.startswith("model-384-") and other.startswith("model-384-") and one != other
    assert group_folder({"model": "hybrid-byte-12l", "length": 384}).startswith("hybrid-byte-12l-384-")


def _grown_collection(model_dir, tmp_path, capsys):
    """A collection of one context (keydiff and no prune) and a later store of two, which adds a row to each file."""
    first, later, collection = tmp_path / "first", tmp_path / "later", tmp_path / "results"
    run_compare(compare_settings(model_dir, first, n=1), show_progress=False)
    assert run_cli(capsys, "publish", first, "--into", collection)[0] == 0
    run_compare(compare_settings(model_dir, later, n=2), show_progress=False)
    [method] = [store for store in stores_below(collection) if store.name == "keydiff--flat"]
    return later, collection, method


@pytest.mark.parametrize("target, change", [("file", "+i"), ("file", "+a"), ("folder", "+a"), ("folder", "+i")])
@pytest.mark.slow  # ~3 s each: two runs; CI's slow run holds it
def test_a_protected_file_or_folder_of_the_collection_is_refused_before_any_is_written(model_dir, tmp_path, capsys,
                                                                                     chattr, target, change):
    """Probe 12: an immutable method file was found after the no-prune file was rewritten, in a bare errno, the
    collection failing verify until publish ran again; an append-only method folder kept a part file. Every file
    publish writes, and the folder it renames it into, is checked before the first is written."""
    later, collection, method = _grown_collection(model_dir, tmp_path, capsys)
    place = method / "results.jsonl.gz" if target == "file" else method
    before = {path: path.read_bytes() for path in collection.rglob("*") if path.is_file()}
    chattr(place, change)
    code, err = run_cli(capsys, "publish", later, "--into", collection)
    attribute = "immutable (chattr +i)" if change == "+i" else "append-only (chattr +a)"
    assert code == 2 and err == (f"bench publish: error: {place} is {attribute}, which stops even root from changing "
                                 f"it as this command would: remove the attribute (chattr -{change[1]} {place}), or "
                                 "publish into a copy of the collection"), err
    assert {path: path.read_bytes() for path in collection.rglob("*") if path.is_file()} == before


def test_a_write_that_fails_part_way_says_the_collection_is_half_published(model_dir, tmp_path, capsys, monkeypatch):
    """A failure after the checks (a full disk) names the file, how many were written, and that publishing again
    completes the collection."""
    later, collection, method = _grown_collection(model_dir, tmp_path, capsys)
    copy = shutil.copyfile

    def full_disk(source, target):
        if "keydiff" in str(target):
            raise OSError(28, "No space left on device")
        return copy(source, target)

    monkeypatch.setattr(shutil, "copyfile", full_disk)
    code, err = run_cli(capsys, "publish", later, "--into", collection)
    assert code == 2 and err.endswith(
        f"{collection}: {method / 'results.jsonl.gz'} could not be written ([Errno 28] No space left on device) after "
        "1 of the 2 files were: the collection is half-published and fails verify until publish is run again, which "
        "completes it"), err
    assert not [path for path in collection.rglob("*") if ".tmp" in path.name]
    monkeypatch.setattr(shutil, "copyfile", copy)
    assert run_cli(capsys, "publish", later, "--into", collection)[0] == 0
    assert run_cli(capsys, "verify", collection)[0] == 0


def test_a_row_outside_its_groups_folder_is_named(model_dir, tmp_path, capsys):
    """Probe 12: a published row's length edited by hand made a group the leaderboard published at a length that
    never ran. A group folder is named after its model, length and settings: the row now lies in another's."""
    first, collection = tmp_path / "first", tmp_path / "results"
    run_compare(compare_settings(model_dir, first, n=1), show_progress=False)
    code, err = run_cli(capsys, "publish", first, "--into", collection)
    assert code == 0, err
    [none] = [store for store in stores_below(collection) if store.name == "none"]
    pack = none / "results.jsonl.gz"
    rows = [json.loads(line) for line in gzip.decompress(pack.read_bytes()).splitlines()]
    rows[0]["length"] = 320  # one its context fits (a far one is refused as a row: test_context_fit.py)
    pack.write_bytes(gzip.compress("".join(json.dumps(row) + "\n" for row in rows).encode()))
    code, err = run_cli(capsys, "verify", collection)
    assert code == 2 and err.endswith(
        f"{pack}:1: a row of {group_folder(rows[0])}/none, in the store {none.parent.name}/none of the collection "
        f"{collection} (expected its group's and method's folder, named after its model, length and settings: one of "
        "them was changed after it was published); restore the file from version control"), err


@pytest.mark.parametrize("rows_of", ["the pack alone", "the pack and another run"])
def test_a_store_file_beside_a_collections_pack_is_named(model_dir, tmp_path, capsys, rows_of):
    """Probe 14, #2: a ``results.jsonl`` that ``compare --out <group>/none`` wrote beside the pack, continuing it with
    a 384-token run's rows, was skipped by the folder checks (they read packs alone): ``verify`` of the collection
    passed. A store of a collection is checked whatever its file, and one that reads another file than its pack is
    named."""
    first, other, collection = tmp_path / "first", tmp_path / "other", tmp_path / "results"
    run_compare(compare_settings(model_dir, first), show_progress=False)
    assert run_cli(capsys, "publish", first, "--into", collection)[0] == 0
    [none] = [store for store in stores_below(collection) if store.name == "none"]
    text = gzip.decompress((none / "results.jsonl.gz").read_bytes()).decode()
    if rows_of == "the pack and another run":
        run_compare(compare_settings(model_dir, other, length=320), show_progress=False)
        text += (other / "results.jsonl").read_text()
    (none / "results.jsonl").write_text(text)
    code, err = run_cli(capsys, "verify", collection)
    assert code == 2 and err.endswith(
        f"{none / 'results.jsonl'}: a store of the collection {collection} reads results.jsonl (expected "
        f"results.jsonl.gz alone, which bench publish writes): a command given {none} as its output wrote it, and its "
        "rows joined the collection unchecked; move it to a folder of its own (and restore the folder's pack from "
        "version control if it changed), then `bench publish FOLDER --into COLLECTION` adds its rows"), err


@pytest.mark.parametrize("how", ["copied in", "through a link"])
def test_a_store_outside_the_collections_layout_is_refused(model_dir, tmp_path, capsys, how):
    """Probe 17, #2: a store under a collection but not at ``<group>/<method>/`` (copied in, or through a link to a
    folder outside) was read as the collection's by verify and the leaderboard, and checked by nothing."""
    first, collection = tmp_path / "first", tmp_path / "results"
    run_compare(compare_settings(model_dir, first, n=1), show_progress=False)
    assert run_cli(capsys, "publish", first, "--into", collection)[0] == 0
    [none] = [store for store in stores_below(collection) if store.name == "none"]
    if how == "copied in":
        shutil.copytree(none, collection / "zz" / "x")
    else:
        shutil.copytree(none, tmp_path / "ext" / "x")
        (collection / "zz").symlink_to(tmp_path / "ext")
    for argv in (["verify", collection], ["leaderboard", collection, "--out", tmp_path / "docs"]):
        code, err = run_cli(capsys, *argv)
        assert code == 2 and f"{collection / 'zz' / 'x'}: a store of the collection {collection} that bench publish " \
            "did not put there" in err, err


@pytest.mark.parametrize("into", ["zz", "a group's new method folder"])
def test_publishing_into_a_folder_inside_a_collection_is_refused(model_dir, tmp_path, capsys, into):
    """Probe 17, #1: ``publish --into <collection>/zz`` (or into a new method folder of a group) wrote a collection
    of its own inside the collection, which no reader of the collection reads; verify still passed."""
    first, collection = tmp_path / "first", tmp_path / "results"
    run_compare(compare_settings(model_dir, first, n=1), show_progress=False)
    assert run_cli(capsys, "publish", first, "--into", collection)[0] == 0
    [none] = [store for store in stores_below(collection) if store.name == "none"]
    target = collection / "zz" if into == "zz" else none.parent / "recency--flat"
    before = _files(tmp_path)
    code, err = run_cli(capsys, "publish", first, "--into", target)
    assert code == 2 and f"--into {target}: is inside the collection {collection}" in err, err
    assert _files(tmp_path) == before


def test_the_library_publish_refuses_a_folder_inside_a_collection_too(model_dir, tmp_path, capsys):
    """Probe 17, #1 at the output policy (:func:`artifacts.output_kinds.mix_problem`): a library caller of
    :func:`bench.store.collection_publish.publish` is refused as the CLI is, before a row is read."""
    from bench.store.collection_publish import publish

    first, collection = tmp_path / "first", tmp_path / "results"
    run_compare(compare_settings(model_dir, first, n=1), show_progress=False)
    publish([first], collection)
    before = _files(tmp_path)
    with pytest.raises(UsageError, match=f"--into {collection / 'zz'}: is inside the collection {collection}"):
        publish([first], collection / "zz")
    assert _files(tmp_path) == before


def test_a_run_one_folder_down_is_no_collection_s_store(model_dir, tmp_path, capsys):
    """Probe 23, #5: ``publish --into R`` where ``R/S`` is a run made ``R`` a collection whose readers left the run
    out, and it could not be resumed in place; a run one folder down a collection was read by no reader."""
    first, runs = tmp_path / "first", tmp_path / "runs"
    run_compare(compare_settings(model_dir, first, n=1), show_progress=False)
    shutil.copytree(first, runs / "S")
    before = _files(tmp_path)
    code, err = run_cli(capsys, "publish", first, "--into", runs)
    assert code == 2 and f"{runs} holds the run {runs / 'S'} one folder down, so it is no collection's folder" \
        in err, err
    assert _files(tmp_path) == before
    collection = tmp_path / "results"
    assert run_cli(capsys, "publish", first, "--into", collection)[0] == 0
    shutil.copytree(first, collection / "S")
    for argv in (["verify", collection], ["leaderboard", collection, "--out", tmp_path / "docs"]):
        code, err = run_cli(capsys, *argv)
        assert code == 2 and f"{collection / 'S'}: a store of the collection {collection} that bench publish did " \
            "not put there" in err, err


def test_a_folder_vanishing_while_a_collection_is_read_is_no_error(model_dir, tmp_path, capsys, monkeypatch):
    """Probe 24, U2: a folder of the collection that another process removed while a reader searched it ended the
    command in a bare ``[Errno 2]``; it holds nothing, and the search is made again where it follows no link."""
    import os

    first, collection = tmp_path / "first", tmp_path / "results"
    run_compare(compare_settings(model_dir, first, n=1), show_progress=False)
    assert run_cli(capsys, "publish", first, "--into", collection)[0] == 0
    (collection / "gone" / "x").mkdir(parents=True)
    listed, failures = os.scandir, []

    def scandir(path="."):
        if os.fspath(path).endswith("gone") and len(failures) < 2:  # vanished as the first searches reached it
            failures.append(path)
            raise FileNotFoundError(2, "No such file or directory", os.fspath(path))
        return listed(path)

    monkeypatch.setattr(os, "scandir", scandir)
    code, err = run_cli(capsys, "verify", collection)
    assert code == 0 and failures, err

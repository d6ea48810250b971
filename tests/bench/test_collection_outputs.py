"""A collection of result stores (``docs/results``) is ``bench publish``'s alone (probe 13, row 28): a store, a page
or an estimator written into its root or into one of its group folders hides it (or is hidden) from every reader —
``bench verify COLL`` read only the store written there — and a collection published into a group folder is one no
reader of the collection reads. Each is refused before any work, in one line naming what the folder is and what to
give; what the collection holds is kept byte for byte."""

import shutil

import pytest

from artifacts.outputs import check
from bench.commands.carry_command import carry_outputs
from bench.commands.cli import COMMANDS, build_parser, main
from tests.bench.test_output_policy import _base, _files

GROUP = "hybrid-byte-12l-4096-5cd813c99d"
"""A setting group's folder, named as :func:`bench.store.collection.group_folder` names one."""


def _collection(tmp):
    """A collection's folders: two groups, their methods' packs (the check reads names, not rows)."""
    collection = tmp / "results"
    for group in (GROUP, "smollm2-135m-hybrid-2048-180c6b6abf"):
        for method in ("none", "snapkv--flat"):
            (collection / group / method).mkdir(parents=True)
            (collection / group / method / "results.jsonl.gz").write_bytes(b"rows")
    (collection / GROUP / "carried.json").write_text("{}")
    return collection


def _command(name):
    return next(command for command in COMMANDS if command.name == name)


OUT_INTO = [("compare", "--out"), ("merge", "--out"), ("leaderboard", "--out"), ("cost", "--out"),
            ("analyze", "--out"), ("train", "--out"), ("label", "--out"), ("distill", "--out")]
"""Commands that write a folder of their own, pointed at a collection or at one of its group folders."""


@pytest.mark.parametrize("where", ["the collection", "a group folder"])
@pytest.mark.parametrize("command, flag", OUT_INTO)
def test_no_other_command_writes_into_a_collection(command, flag, where, model_dir, tmp_path, capsys, guarded):
    model = shutil.copytree(model_dir, tmp_path / "model")
    (tmp_path / "store").mkdir()
    (tmp_path / "labels").mkdir()
    collection = _collection(tmp_path)
    place = collection if where == "the collection" else collection / GROUP
    before = _files(tmp_path)
    code = main(_base(command, flag, place, model, tmp_path) + (["--replace"] if command == "train" else []))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    shown = (f"holds a collection of result stores (bench publish) ({GROUP}/none/results.jsonl.gz)"
             if where == "the collection" else
             "holds the stores of one setting group of a collection (bench publish) (none/results.jsonl.gz)")
    assert f"{flag} {place}: {shown}, not " in err and "give a folder of its own" in err, err
    if command in ("compare", "merge"):
        assert err.endswith("(a store joins a collection by `bench publish STORE --into COLLECTION`)\n"), err
    assert _files(tmp_path) == before


@pytest.mark.parametrize("into, said", [
    (f"results/{GROUP}", "is a setting group's folder of the collection {collection} (its stores are "
                         "{collection}/" + GROUP + "/<method>/), and a collection is published into whole, each row "
                         "into its group's folder; give the collection, {collection}"),
    (f"results/{GROUP}/none", "is a result store (it holds its own results.jsonl.gz), not a collection of them: a "
                              "store of the collection {collection}; give the collection, {collection}"),
    ("store", "is a result store (it holds its own results.jsonl), not a collection of them: give the collection's "
              "folder (docs/results)"),
])
def test_publish_into_a_part_of_a_collection_names_the_collection(into, said, tmp_path, capsys, guarded):
    collection = _collection(tmp_path)
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "results.jsonl").write_text("")
    before = _files(tmp_path)
    code = main(["publish", str(tmp_path / "store"), "--into", str(tmp_path / into)])
    err = capsys.readouterr().err
    assert code == 2 and err == f"bench publish: error: --into {tmp_path / into}: " \
                                f"{said.format(collection=collection)}\n", err
    assert _files(tmp_path) == before


def test_the_commands_that_write_a_collection_take_it(tmp_path):
    """publish into the collection, carry of the collection and of one group folder (its carried.json) pass."""
    collection = _collection(tmp_path)
    parser = build_parser()
    check(_command("publish").outputs(parser.parse_args(["publish", "s", "--into", str(collection)])))
    for given in (collection, collection / GROUP):
        check(carry_outputs(parser.parse_args(["carry", str(given)])))


def test_a_folder_of_stores_that_is_no_collection_is_not_refused(tmp_path):
    """``docs/`` holds stores two folders down (``docs/realmodel/<run>/``) and a leaderboard: not a collection, as no
    folder there is named as a setting group's, so ``bench leaderboard --out docs`` is not refused."""
    docs = tmp_path / "docs"
    (docs / "realmodel" / "diag-2048").mkdir(parents=True)
    (docs / "realmodel" / "diag-2048" / "results.jsonl.gz").write_bytes(b"rows")
    (docs / "results").mkdir()
    check(_command("leaderboard").outputs(build_parser().parse_args(["leaderboard", "s", "--out", str(docs)])))


@pytest.mark.parametrize("method", ["none", "kvzip--flat", "a folder of no method", "none/sub"])
@pytest.mark.parametrize("command", ["compare", "merge", "carry"])
def test_no_store_is_written_into_a_method_folder_of_a_collection(command, method, model_dir, tmp_path, capsys,
                                                                  guarded):
    """Probe 14, #2: ``compare --out <collection>/<group>/none`` copied the pack to results.jsonl and appended a
    384-token run's rows there, beside the pack, and ``verify`` of the collection still passed. A method's folder of a
    collection, held or still to be made (of a group the collection holds or of a new one), is refused as its root
    and group folders are, before any work, and so is a folder within one (``none/sub``, probe 15: no reader of the
    collection reads it); ``carry`` of one store of a group is named with the group to carry."""
    model = shutil.copytree(model_dir, tmp_path / "model")
    (tmp_path / "store").mkdir()
    collection = _collection(tmp_path)
    group = GROUP if method != "a folder of no method" else "hybrid-byte-12l-384-0123456789"
    place = collection / group / (method if method != "a folder of no method" else "none")
    before = _files(tmp_path)
    argv = ["carry", str(place)] if command == "carry" else _base(command, "--out", place, model, tmp_path)
    code = main(argv)
    err = capsys.readouterr().err
    flag = "store" if command == "carry" else "--out"
    assert code == 2 and err == (
        f"bench {command}: error: {flag} {place}: is inside the setting group {group} of the collection "
        f"{collection}, whose stores bench publish alone writes, checking the collection whole first: write a store "
        f"into a folder of its own and publish it (`bench publish STORE --into {collection}`); a group of the "
        f"collection is carried whole (`bench carry {collection / group}`)\n"), err
    assert _files(tmp_path) == before


@pytest.mark.parametrize("command", ["compare", "merge"])
def test_a_method_folder_reached_through_a_link_is_refused_as_well(command, model_dir, tmp_path, capsys, guarded):
    """Probe 15, #5: with ``lnk -> <collection>/<group>``, ``compare --out lnk/none`` wrote its store into the
    collection's ``none/`` folder, beside the pack: the folder is resolved, links and all, before it is tested."""
    model = shutil.copytree(model_dir, tmp_path / "model")
    (tmp_path / "store").mkdir()
    collection = _collection(tmp_path).resolve()
    (tmp_path / "lnk").symlink_to(collection / GROUP)
    place = tmp_path / "lnk" / "none"
    before = _files(tmp_path)
    code = main(_base(command, "--out", place, model, tmp_path))
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(
        f"bench {command}: error: --out {place}: is inside the setting group {GROUP} of the collection "
        f"{collection}, whose stores bench publish alone writes"), err
    assert _files(tmp_path) == before


@pytest.mark.parametrize("below", ["zz/x", "zz/x/deeper", "zz", "hybrid-byte-12l-384-e73c20eb28", "lnc/zz/x"])
@pytest.mark.parametrize("command", ["compare", "merge"])
def test_no_store_is_written_anywhere_inside_a_collection(command, below, model_dir, tmp_path, capsys, guarded):
    """Probe 16, #2: ``compare --out <collection>/zz/x`` was accepted, and verify, leaderboard and publish then read
    that store as the collection's own, unpacked and unchecked; a new folder named as a group right below the
    collection was accepted too (its store read by no reader). A folder anywhere inside a collection, whatever its
    name, held or still to be made, reached through a link or not, is refused before any work."""
    model = shutil.copytree(model_dir, tmp_path / "model")
    (tmp_path / "store").mkdir()
    collection = _collection(tmp_path)
    (collection / "zz").mkdir()
    (tmp_path / "lnc").symlink_to(collection)
    place = tmp_path / below if below.startswith("lnc/") else collection / below
    before = _files(tmp_path)
    code = main(_base(command, "--out", place, model, tmp_path))
    err = capsys.readouterr().err
    assert code == 2 and err == (
        f"bench {command}: error: --out {place}: is inside the collection {collection}, whose stores bench publish "
        "alone writes, checking the collection whole first (every reader of the collection reads a store two folders "
        "below it as one of its own): write a store into a folder of its own and publish it "
        f"(`bench publish STORE --into {collection}`)\n"), err
    assert _files(tmp_path) == before



def test_a_folder_that_vanishes_while_it_is_searched_holds_nothing(tmp_path, monkeypatch):
    """Probe 23, #1: the output check looks for a collection in every folder above ``--out`` (``/tmp`` among them);
    a folder of another process that vanished while it was listed ended the command in ``FileNotFoundError``."""
    import os

    from artifacts.output_kinds import COLLECTION, collection_holding

    (tmp_path / "gone" / "x").mkdir(parents=True)
    listed = os.scandir

    def scandir(path="."):
        if os.fspath(path).endswith("gone"):
            raise FileNotFoundError(2, "No such file or directory", os.fspath(path))
        return listed(path)

    monkeypatch.setattr(os, "scandir", scandir)
    assert COLLECTION.found_in(tmp_path) is None
    assert collection_holding(tmp_path / "out" / "store") is None

"""Carries in sequence (probe 18): a collection group carried twice takes a new method by ``bench publish`` (its
scratch check read the existing rows under the records twice, and refused every group of docs/results), and a store
outside a collection is carried twice, its own record read back (it names no stores)."""

import json
import shutil
from contextlib import contextmanager

import pytest

import bench.run.carry
import bench.run.plan
import bench.store.collection_publish
from bench.run.compare import run_compare
from bench.store.carried_codes import CARRIED
from bench.store.code_version import code_version
from tests.helpers import compare_settings, run_cli

FIRST, SECOND = "a0c0de000001", "a0c0de000002"
"""The codes of two 'earlier checkouts'."""


@contextmanager
def _at(code: str | None):
    """Runs and carries of ``code`` within (``None``: this checkout's)."""
    with pytest.MonkeyPatch.context() as patch:
        if code is not None:
            patch.setattr(bench.run.plan, "code_version", lambda engine="hf": code)
            patch.setattr(bench.run.carry, "code_version", lambda engine="hf": code)
            patch.setattr(bench.store.collection_publish, "code_version", lambda engine="hf": code)
        yield


@pytest.fixture(scope="module")
def _twice(model_dir, tmp_path_factory):
    """keydiff and no prune computed at :data:`FIRST`, published, carried to :data:`SECOND` and then to this
    checkout's code; a collection and a plain store, each carried so."""
    folder = tmp_path_factory.mktemp("chains")
    first, collection = folder / "first", folder / "results"
    with _at(FIRST):
        run_compare(compare_settings(model_dir, first, n=1), show_progress=False)
    plain = folder / "plain"
    shutil.copytree(first, plain)
    assert run_cli_ok("publish", first, "--into", collection)
    [group] = collection.iterdir()
    for code in (SECOND, None):
        with _at(code):
            assert run_cli_ok("carry", group, "--sample", "1", "--model", model_dir)
            assert run_cli_ok("carry", plain, "--sample", "1", "--model", model_dir)
    return collection, plain


def run_cli_ok(*argv) -> bool:
    from bench.commands.cli import main

    return main(list(map(str, argv))) == 0


def test_a_group_carried_twice_takes_a_new_method(_twice, model_dir, tmp_path, capsys):
    collection = tmp_path / "results"
    shutil.copytree(_twice[0], collection)
    [group] = collection.iterdir()
    assert [(r["from"], r["to"]) for r in json.loads((group / CARRIED).read_text())] == [
        (FIRST, SECOND), (SECOND, code_version())]
    before = {p: p.read_bytes() for p in collection.rglob("*") if p.is_file()}
    new = tmp_path / "new"
    run_compare(compare_settings(model_dir, new, presses=["snapkv"], n=1), show_progress=False)
    code, err = run_cli(capsys, "publish", new, "--into", collection)
    assert code == 0, err
    assert {p: p.read_bytes() for p in before} == before  # the group's files as they were: the new method beside
    assert run_cli(capsys, "verify", collection)[0] == 0


def test_a_plain_store_carried_twice_keeps_both_records(_twice, capsys):
    plain = _twice[1]
    assert [(r["from"], r["to"]) for r in json.loads((plain / CARRIED).read_text())] == [
        (FIRST, SECOND), (SECOND, code_version())]
    assert {row["code"] for row in map(json.loads, (plain / "results.jsonl").read_text().splitlines())} == {
        code_version()}
    assert run_cli(capsys, "verify", plain)[0] == 0


@pytest.mark.parametrize("change, says", [
    (lambda r: r.update(stores=[*r["stores"], r["stores"][0]]), "stores"),  # a store named twice
    (lambda r: r.update(stores=[*r["stores"], ".."]), "stores"),
    (lambda r: r.update(contexts=[*r["contexts"], r["contexts"][0]]), "each once"),
    (lambda r: [r[f].update({"no such/method/x": "4d7538aab877"}) for f in ("method_codes", "method_codes_from")],
     "method_codes names \"no such/method/x\", which is no method's label as this bench writes it (press/allocator): "
     "the label 'no such' cannot be read back"),
    (lambda r: [r[f].update({"snapkv(window=16)": "4d7538aab877"}) for f in ("method_codes", "method_codes_from")],
     "method_codes names \"snapkv(window=16)\", which is no method's label as this bench writes it (press/allocator): "
     "it has no '/' between its press and its allocator"),
    # probe 21, U2: the key named alone, not a list of them cut before it
    (lambda r: [r[f].update({"snapkv(gqa=mean,window=16)/flat": "4d7538aab877"})
                for f in ("method_codes", "method_codes_from")],
     "method_codes names \"snapkv(gqa=mean,window=16)/flat\", which is no method's label as this bench writes it "
     "(press/allocator): the label 'snapkv(gqa=mean,window=16)' cannot be read back"),
])
def test_a_record_naming_what_no_carry_names_is_refused(_twice, tmp_path, capsys, change, says):
    """Probe 18, #7: a record's stores named twice or as ``..``, a context twice, a method key that is no method's
    label passed every reader."""
    collection = tmp_path / "results"
    shutil.copytree(_twice[0], collection)
    [group] = collection.iterdir()
    records = json.loads((group / CARRIED).read_text())
    change(records[-1])
    (group / CARRIED).write_text(json.dumps(records))
    code, err = run_cli(capsys, "verify", collection)
    assert code == 2 and f"record {len(records) - 1}: " in err and says in err, err


@pytest.mark.parametrize("code", ["", "0123", "DEADBEEF0000", "0123456789ab "])
def test_a_row_of_a_code_no_run_writes_is_refused_by_every_reader(_twice, tmp_path, capsys, code):
    """Probe 18, #6: verify and publish took rows whose code carry then refused as edited."""
    store = tmp_path / "store"
    shutil.copytree(_twice[1], store)
    (store / CARRIED).unlink()
    rows = [json.loads(line) for line in (store / "results.jsonl").read_text().splitlines()]
    (store / "results.jsonl").write_text("".join(json.dumps({**row, "code": code}) + "\n" for row in rows))
    for argv in (["verify", store], ["publish", store, "--into", tmp_path / "c"]):
        status, err = run_cli(capsys, *argv)
        assert status == 2 and f"code={code!r} (expected a code, 12 hex digits" in err, err
    assert not (tmp_path / "c").exists()


def test_publishing_into_a_folder_above_a_collection_is_refused(_twice, tmp_path, capsys):
    """Probe 18, #5: ``publish --into up`` with ``up/c`` a collection made ``up`` a collection whose readers never
    read ``up/c``."""
    up = tmp_path / "up"
    shutil.copytree(_twice[0], up / "c")
    before = sorted(p for p in up.rglob("*"))
    code, err = run_cli(capsys, "publish", _twice[0] / next(_twice[0].iterdir()).name / "none", "--into", up)
    assert code == 2 and "a store of the collection" in err and str(up / "c") in err, err
    assert sorted(p for p in up.rglob("*")) == before


def test_carry_refuses_a_folder_of_plain_stores_as_a_group(_twice, tmp_path, capsys):
    """Probe 18, U4: a folder of plain stores was carried as a collection's group folder (its record naming them,
    its rows left at their code), while verify refused the layout."""
    multi = tmp_path / "w" / "multi"
    shutil.copytree(_twice[1], multi / "a")
    (multi / "a" / CARRIED).unlink()
    before = sorted(p for p in multi.rglob("*"))
    code, err = run_cli(capsys, "carry", multi)
    assert code == 2 and f"{multi} holds stores one folder down (a, …) but is no setting group's folder" in err, err
    assert sorted(p for p in multi.rglob("*")) == before


def test_a_chain_that_comes_back_to_a_code_takes_new_rows_of_it(_twice, model_dir, tmp_path, capsys):
    """Probe 19, #2: after carries A→B→C→A, fresh rows of A (the group's code) were read through the first record,
    as rows of a method its carry did not cover, and refused."""
    collection = tmp_path / "results"
    shutil.copytree(_twice[0], collection)
    [group] = collection.iterdir()
    new = tmp_path / "new"
    with _at(FIRST):
        assert run_cli_ok("carry", group, "--sample", "1", "--model", model_dir)
        run_compare(compare_settings(model_dir, new, presses=["snapkv"], n=1), show_progress=False)
        code, err = run_cli(capsys, "publish", new, "--into", collection)
        assert code == 0, err
        assert [r["to"] for r in json.loads((group / CARRIED).read_text())] == [SECOND, code_version(), FIRST]
        assert run_cli(capsys, "verify", collection)[0] == 0


def test_rows_a_forged_record_would_carry_are_refused(_twice, model_dir, tmp_path, capsys):
    """Probe 19, #3: a method and its store added to every record of a group let rows of an earlier code be
    published as carried, no carry having rerun them: publish refuses a new row that a record would carry."""
    collection = tmp_path / "results"
    shutil.copytree(_twice[0], collection)
    [group] = collection.iterdir()
    old = tmp_path / "old"
    with _at(FIRST):
        run_compare(compare_settings(model_dir, old, presses=["snapkv"], n=1), show_progress=False)
    [own] = {row["method_code"] for row in map(json.loads, (old / "results.jsonl").read_text().splitlines())
             if row["press"] == "snapkv"}
    records = json.loads((group / CARRIED).read_text())
    for record in records:
        for field in ("method_codes_from", "method_codes"):
            record[field]["snapkv/flat"] = own
        record["stores"] = sorted([*record["stores"], "snapkv--flat"])
    (group / CARRIED).write_text(json.dumps(records))
    before = {p: p.read_bytes() for p in collection.rglob("*") if p.is_file()}
    code, err = run_cli(capsys, "publish", old, "--into", collection)
    assert code == 2 and f"is of code {FIRST}, which {group} was carried away from" in err, err
    assert {p: p.read_bytes() for p in collection.rglob("*") if p.is_file()} == before


def test_a_store_the_group_holds_is_published_as_nothing_new_after_the_chain_comes_back(_twice, model_dir, tmp_path,
                                                                                        capsys):
    """Probe 20, #1: after carries A→B→C→A→B, the store of A the group was published from (every row held) was
    refused as a method the first carry did not cover, where nothing is new."""
    collection = tmp_path / "results"
    shutil.copytree(_twice[0], collection)
    [group] = collection.iterdir()
    with _at(FIRST):
        assert run_cli_ok("carry", group, "--sample", "1", "--model", model_dir)
    with _at(SECOND):
        assert run_cli_ok("carry", group, "--sample", "1", "--model", model_dir)
        before = {p: p.read_bytes() for p in collection.rglob("*") if p.is_file()}
        code, err = run_cli(capsys, "publish", _twice[0].parent / "first", "--into", collection)
    assert code == 0, err
    assert {p: p.read_bytes() for p in collection.rglob("*") if p.is_file()} == before


def test_a_method_the_carries_did_not_cover_is_told_where_to_carry_it(_twice, model_dir, tmp_path, capsys):
    """Probe 24, U1: a store of the first code of a group carried on twice was told to carry itself under that
    checkout, where a carry has nothing to do, and the line named the first carry's code, not the group's now."""
    collection, group = _twice[0], next(_twice[0].iterdir())
    before = {p: p.read_bytes() for p in collection.rglob("*") if p.is_file()}
    new = tmp_path / "new"
    with _at(FIRST):
        run_compare(compare_settings(model_dir, new, presses=["snapkv"], n=1), show_progress=False)
        code, err = run_cli(capsys, "publish", new, "--into", collection)
    now = code_version()
    assert code == 2 and err.endswith(
        f"is of code {FIRST}, from which {group} was carried to code {SECOND} and on to code {now} "
        f"({group / CARRIED}), and the carry did not cover it (its method was not in the group then): the group is of "
        f"code {now} now, this checkout of code {FIRST}: carry the store to code {now} with a checkout of that code "
        f"(bench carry {new}) and publish it from there, or carry the group to this checkout's code first (bench carry "
        f"{group})"), err
    assert {p: p.read_bytes() for p in collection.rglob("*") if p.is_file()} == before

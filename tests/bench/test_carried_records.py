"""A collection's records of carried groups (``carried.json``) are checked against the rows they carry (probe 17, #5
and U2): a record that proves nothing (no contexts, no rows, a sample of 0), names a code of another form, a context
its group's rows lack, a method code this checkout does not give (where it carried the group to this checkout's
code), or a chain that a removed record broke is refused by every reader, naming the file and the record; the
records of ``docs/results`` pass. With the record deleted, verify names it, not the intact ``none`` store."""

import json
import shutil
from pathlib import Path

import pytest

import bench.run.plan
from bench.run.compare import run_compare
from bench.store.carried_codes import CARRIED, read_records, record_problem
from bench.store.code_version import code_version
from tests.helpers import compare_settings, run_cli

OLD = "a0c0de000000"
"""The code of an 'earlier checkout' the collection's rows ran."""
DOCS = Path(__file__).resolve().parents[2] / "docs" / "results"


@pytest.fixture(scope="module")
def _carried_once(model_dir, tmp_path_factory):
    """A collection of one group, keydiff and no prune on two contexts computed at :data:`OLD`, carried to this
    checkout's code by one record (a rerun of one context), and snapkv's children published after the carry at this
    code: every test forges a copy."""
    folder = tmp_path_factory.mktemp("records")
    old, new, collection = folder / "old", folder / "new", folder / "results"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bench.run.plan, "code_version", lambda engine="hf": OLD)
        run_compare(compare_settings(model_dir, old, n=2), show_progress=False)
    run_compare(compare_settings(model_dir, new, presses=["snapkv"], n=2), show_progress=False)
    assert main_ok("publish", old, "--into", collection)
    [group] = collection.iterdir()
    assert main_ok("carry", group, "--sample", "1", "--model", model_dir)
    assert main_ok("publish", new, "--into", collection)
    return collection


def main_ok(*argv) -> bool:
    from bench.commands.cli import main

    return main(list(map(str, argv))) == 0


@pytest.fixture
def collection(_carried_once, tmp_path):
    """A copy of the carried collection, and its group folder's record of carries."""
    copy = tmp_path / "results"
    shutil.copytree(_carried_once, copy)
    [group] = copy.iterdir()
    return copy, group / CARRIED


def _records(path):
    return json.loads(path.read_text())


def _write(path, records):
    path.write_text(json.dumps(records, indent=1) + "\n")


def test_the_carried_collection_and_the_records_of_docs_pass(collection, capsys):
    copy, path = collection
    [record] = _records(path)
    assert (record["from"], record["to"], record["stores"]) == (OLD, code_version(), ["keydiff--flat", "none"])
    assert run_cli(capsys, "verify", copy)[0] == 0
    real = sorted(DOCS.glob(f"*/{CARRIED}"))
    assert len(real) >= 4 and all(read_records(p) for p in real)


@pytest.mark.parametrize("change, field", [
    ({"contexts": [], "sample": 0, "rows": 0}, "contexts []"),  # the probe's record of a carry that reran nothing
    ({"sample": 0}, "sample 0"),
    ({"rows": 0}, "rows 0"),
    ({"contexts": [["niah_single_1", -1, "generated"]]}, "contexts"),
    ({"contexts": [["niah_single_1", "0", "generated"]]}, "contexts"),
    ({"to": "DEADBEEF0000"}, "to \"DEADBEEF0000\""),
    ({"to": "deadbeef"}, "to \"deadbeef\""),
    ({"to": OLD}, f"from and to are both {OLD}"),
    ({"from": "b0c0de000000"}, "group"),  # the group's code is the from code
    ({"method_codes": {"none": "none", "keydiff/flat": "a"}}, "method_codes"),
    ({"method_codes": {"none": "aaaaaaaaaaaa", "keydiff/flat": "aaaaaaaaaaaa"}}, "method_codes"),
    ({"method_codes_from": {"none": "none"}}, "method_codes names"),
    ({"stores": []}, "stores []"),
    ({"seed": None}, "seed null"),
])
def test_a_record_of_another_form_is_refused_by_every_reader(collection, capsys, change, field):
    copy, path = collection
    [record] = _records(path)
    _write(path, [{**record, **change}])
    for command in ("verify", "leaderboard"):
        code, err = run_cli(capsys, command, copy, *(["--out", copy.parent / "board"] if command == "leaderboard"
                                                    else []))
        assert code == 2 and f"{path}: record 0: {field}" in err and err.endswith(
            "which no carry writes; restore it from version control"), err


def test_the_records_a_carry_writes_are_of_the_form_read(collection):
    """Rows computed before method codes name none: their code before is null."""
    [record] = _records(collection[1])
    assert record_problem(record) is None
    assert record_problem({**record, "method_codes_from": dict.fromkeys(record["method_codes_from"])}) is None
    assert record_problem({**record, "method_codes": dict.fromkeys(record["method_codes"])}) is not None


def test_a_context_the_rows_lack_is_refused(collection, capsys):
    copy, path = collection
    [record] = _records(path)
    _write(path, [{**record, "contexts": [["niah_single_1", 7, "generated"]], "sample": 1}])
    code, err = run_cli(capsys, "verify", copy)
    assert code == 2 and f"{path}: record 0 (carried from code {OLD} to {code_version()}) names the context (task " \
        "niah_single_1, item 7, generated haystack) as rerun" in err, err


def test_a_method_code_this_checkout_does_not_give_is_refused(collection, capsys):
    """The probe's docs copy: a method's code after the last record changed; or, as round 20 U1 found, a user's
    module edited since the carry: both are named."""
    copy, path = collection
    [record] = _records(path)
    real = record["method_codes"]["keydiff/flat"]
    _write(path, [{**record, "method_codes": {**record["method_codes"], "keydiff/flat": "aaaaaaaaaaaa"}}])
    code, err = run_cli(capsys, "verify", copy)
    assert code == 2 and err.endswith(
        f"{path}: record 0 (carried from code {OLD} to {code_version()}): its method_codes gives keydiff/flat the "
        f"code aaaaaaaaaaaa, but this checkout, whose code it carried the group to, gives keydiff/flat the code "
        f"{real}: either a module of its press or allocator changed since that carry (a user's module edited: its rows "
        "are then no numbers of this code; rerun it under this code into a store of its own), or the record was "
        "changed (a carry names the codes its rerun gave; restore it from version control)"), err


def _chain(record):
    """``record`` as the last of three: the group carried OLD → B → C → this code."""
    codes = [OLD, "b0c0de000000", "c0c0de000000", record["to"]]
    after = record["method_codes"]
    return [{**record, "group": {**record["group"], "code": codes[i]}, "from": codes[i], "to": codes[i + 1],
             "method_codes_from": record["method_codes_from"] if i == 0 else after} for i in range(3)]


def test_a_chain_of_records_passes_and_one_removed_from_it_is_refused(collection, capsys):
    """As the probe's: no method published since the carries, whose rows would tell the codes apart."""
    copy, path = collection
    group = path.parent
    shutil.rmtree(group / "snapkv--flat")
    [record] = _records(path)
    chain = _chain(record)
    _write(path, chain)
    assert run_cli(capsys, "verify", copy)[0] == 0
    for removed in (1, 0):  # a middle record, the first
        _write(path, chain[:removed] + chain[removed + 1:])
        code, err = run_cli(capsys, "verify", copy)
        assert code == 2 and f"{path}: record {removed} (carried from code {chain[removed + 1]['from']} to " \
            f"{chain[removed + 1]['to']}) names the group's none store, {group / 'none' / 'results.jsonl.gz'}, but " \
            "carries none of its rows" in err, err
    # a method's store verified alone: its rows stop at the removed record's code
    _write(path, chain[:1] + chain[2:])
    keydiff = group / "keydiff--flat"
    code, err = run_cli(capsys, "verify", keydiff)
    assert code == 2 and f"{keydiff / 'results.jsonl.gz'}:1: a row computed at code {OLD} reads at code " \
        f"b0c0de000000 under {path}, whose record 1, the last that names its store, carried the group to code " \
        f"{record['to']}: a record before it was removed or changed" in err, err
    # the probe's forged code: a middle record's to made up, the next record's from no row reaches
    _write(path, [{**chain[0], "to": "deadbeef0000"}, *chain[1:]])
    code, err = run_cli(capsys, "verify", copy)
    assert code == 2 and "record 1 (carried from code b0c0de000000" in err and "carries none of its rows" in err, err


def test_a_deleted_record_is_named_not_the_none_store(collection, capsys):
    """Probe 17, U2: snapkv's children, published at this code after the carry, read against no-prune rows that
    only the record carries to it."""
    copy, path = collection
    group = path.parent
    child = f"{group / 'snapkv--flat' / 'results.jsonl.gz'}:1: a child of snapkv/flat whose no-prune row (task "
    path.unlink()
    code, err = run_cli(capsys, "verify", copy)
    assert code == 2 and child in err and err.endswith(
        f"does not hold, against which its ΔNLL and KL were measured; the none store holds it at code {OLD}, and the "
        f"group's record of its carries, {path}, under which its rows read at the code they were carried to, is "
        f"missing: restore {path} from version control"), err
    assert f"restore {group / 'none'}" not in err


def test_a_record_that_no_longer_carries_the_none_store_is_named(collection, capsys):
    copy, path = collection
    [record] = _records(path)
    _write(path, [{**record, "stores": ["keydiff--flat"]}])
    code, err = run_cli(capsys, "verify", copy)
    assert code == 2 and f"the none store holds it at code {OLD}, and the group's record of its carries, {path}, " \
        "does not carry the two to one code: restore it from version control" in err, err


@pytest.mark.parametrize("label", ["keydiff/flat", "kvpress:TOVAPress/flat", "snapkv/head_shares"])
def test_a_methods_code_of_its_classes_is_its_code_built(label, model_dir):
    """What a record's method code is checked against is what a run of the method names (the kvpress adapter's
    scorer class, the head shares file of the model folder)."""
    import allocators
    import presses
    from bench.store.carried_checks import _classes
    from bench.store.code_version import class_method_codes, method_codes

    press, allocator = label.split("/")
    built = method_codes([(presses.get(press), allocators.get(allocator))], "hf", model_dir)
    assert class_method_codes([_classes(label)], "hf", model_dir) == built
    if allocator == "head_shares":  # its file of the model folder is part of the code
        assert class_method_codes([_classes(label)], "hf", None) != built


def test_carry_refuses_rows_of_a_code_no_run_writes_before_a_rerun(model_dir, tmp_path, capsys):
    """A row's code edited to no code (``0ld0c0de0000``: an ``l``) was carried, and the record written named it as
    its ``from``, which every reader then refused: carry's check of the rows names it first, and writes nothing."""
    store = tmp_path / "store"
    run_compare(compare_settings(model_dir, store, n=1), show_progress=False)
    rows = [json.loads(line) for line in (store / "results.jsonl").read_text().splitlines()]
    (store / "results.jsonl").write_text("".join(json.dumps({**r, "code": "0ld0c0de0000"}) + "\n" for r in rows))
    before = {p: p.read_bytes() for p in store.iterdir() if p.is_file()}
    code, err = run_cli(capsys, "carry", store, "--model", model_dir)
    assert code == 2 and "code='0ld0c0de0000' (expected a code, 12 hex digits" in err, err
    assert {p: p.read_bytes() for p in store.iterdir() if p.is_file()} == before


def test_a_method_key_renamed_is_named_as_the_record_s_own(collection, capsys):
    """Probe 22, U3: a record whose key of a method it carried was renamed (to another readable label) was blamed on
    a record before it, removed or changed, where it is the only one (a press not registered here: its code is not
    checked)."""
    copy, path = collection
    [record] = _records(path)
    renamed = {field: {("userp/flat" if m == "keydiff/flat" else m): c for m, c in record[field].items()}
               for field in ("method_codes", "method_codes_from")}
    _write(path, [{**record, **renamed}])
    code, err = run_cli(capsys, "verify", copy)
    assert code == 2 and f"{path}: record 0 names the store keydiff--flat but gives its method keydiff/flat no code" \
        in err and "a record before it" not in err, err

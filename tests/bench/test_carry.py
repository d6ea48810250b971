"""``bench carry``: a group computed by an earlier code is carried to this checkout's when a rerun of a sample of its
contexts gives every value again; one value that differs refuses it, naming the value and its method. A carried group
takes a new method's rows by running only those."""

import json
import os
import random
import shutil
from pathlib import Path

import pytest

import bench.run.carry
import bench.run.plan
from bench.run.compare import run_compare
from bench.store.carried_codes import CARRIED
from bench.store.code_version import code_version
from bench.store.result_store import ResultStore
from tests.helpers import compare_settings, run_cli

OLD = "01d0c0de0000"  # a code as the bench writes one: 12 hex digits (a record names it)


@pytest.fixture(scope="module")
def _old_store_once(model_dir, tmp_path_factory):
    """A store of two contexts, keydiff and snapkv at two fractions, written by an 'earlier code': its rows name
    another code and, as every row written before method codes, none of their own. Run once a module (a minute of
    the default test run's ten, were each test to run it); each test carries a copy (:func:`old_store`)."""
    out = tmp_path_factory.mktemp("carry") / "store"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bench.run.plan, "code_version", lambda engine="hf": OLD)
        run_compare(compare_settings(model_dir, out, presses=["keydiff", "snapkv", "none"], keep_fractions=[0.3, 0.6],
                                     n=2), show_progress=False)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    for row in rows:
        del row["method_code"]
    (out / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return out


@pytest.fixture
def old_store(_old_store_once, tmp_path):
    """A copy of the earlier code's store, for one test to carry (carry rewrites it in place)."""
    out = tmp_path / "store"
    out.mkdir()
    shutil.copyfile(_old_store_once / "results.jsonl", out / "results.jsonl")
    return out


def test_a_group_whose_numbers_hold_is_carried_and_a_new_method_joins_it(old_store, model_dir, tmp_path, capsys):
    before = ResultStore(old_store, readonly=True).rows
    code, err = run_cli(capsys, "carry", old_store, "--sample", "1", "--model", model_dir)
    assert code == 0, err
    after = ResultStore(old_store, readonly=True).rows
    assert len(after) == len(before) and {r["code"] for r in after} == {code_version()}
    assert {r["carried_from"] for r in after} == {OLD}
    def values(rows):
        return [{k: v for k, v in r.items() if k not in ("code", "method_code", "carried_from")} for r in rows]

    assert values(after) == values(before)
    [record] = json.loads((old_store / CARRIED).read_text())
    assert record["from"] == OLD and record["to"] == code_version() and len(record["contexts"]) == 1
    assert set(record["method_codes"]) == {"keydiff/flat", "snapkv/flat", "none"}
    assert run_cli(capsys, "verify", old_store)[0] == 0
    # a new method joins the carried group with its own rows alone
    run_compare(compare_settings(model_dir, old_store, presses=["keydiff", "snapkv", "kvzip", "none"],
                                 keep_fractions=[0.3, 0.6], n=2), show_progress=False)
    joined = ResultStore(old_store, readonly=True).rows
    assert joined[:len(after)] == after and {r["press"] for r in joined[len(after):]} == {"kvzip"}
    assert run_cli(capsys, "verify", old_store)[0] == 0
    # and again: nothing left to carry
    code, err = run_cli(capsys, "carry", old_store, "--model", model_dir)
    assert code == 0 and len(json.loads((old_store / CARRIED).read_text())) == 1


def test_a_group_whose_numbers_changed_is_refused_naming_the_value(old_store, model_dir, capsys):
    lines = (old_store / "results.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    # every snapkv row's answer NLL moved, as an edit of its code would move them
    for row in rows:
        if row["press"] == "snapkv":
            row["answer_nll"] += 1e-3
            row["delta_nll"] += 1e-3
    (old_store / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    kept = (old_store / "results.jsonl").read_bytes()
    code, err = run_cli(capsys, "carry", old_store, "--sample", "1", "--model", model_dir)
    assert code == 2 and "answer_nll of snapkv/flat" in err and "cannot be carried" in err, err
    assert (old_store / "results.jsonl").read_bytes() == kept and not (old_store / CARRIED).exists()


@pytest.mark.slow  # ~7 s: carries the store twice; CI's slow run holds it
def test_real_values_in_their_last_digits_are_equal_counts_and_texts_are_not(old_store, model_dir, capsys):
    """Another CPU moves float32 NLLs and KLs in their last digits: the group is carried. A text that moves is a
    changed answer: refused."""
    path = old_store / "results.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        row["answer_nll"] *= 1 + 3e-7
        row["kl"] = row.get("kl") and row["kl"] * (1 - 3e-7)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tampered = [dict(row) for row in rows]
    for row in tampered:
        row["prediction"] = row.get("prediction", "") + "!"
    code, err = run_cli(capsys, "carry", old_store, "--sample", "2", "--model", model_dir)
    assert code == 0, err
    assert [r["answer_nll"] for r in ResultStore(old_store, readonly=True).rows] == [r["answer_nll"] for r in rows]
    path.write_text("".join(json.dumps({**row, "code": OLD}) + "\n" for row in tampered))
    (old_store / CARRIED).unlink()
    code, err = run_cli(capsys, "carry", old_store, "--sample", "2", "--model", model_dir)
    assert code == 2 and "prediction of" in err, err


@pytest.mark.slow  # ~19 s: answers the store again, then carries it twice; CI's slow run holds it
def test_a_store_this_code_answered_again_is_carried_without_a_second_copy(old_store, model_dir, capsys):
    """A store an earlier code began and this code resumed holds each key twice, once a group: carried, the copies
    of equal values fold into one (verify then passes); a copy of another value is refused, nothing written."""
    settings = compare_settings(model_dir, old_store, presses=["keydiff", "snapkv", "none"], keep_fractions=[0.3, 0.6],
                                n=2)
    run_compare(settings, show_progress=False)
    rows = ResultStore(old_store, readonly=True).rows
    native = [r for r in rows if r["code"] == code_version()]
    assert len(native) * 2 == len(rows)
    kept = (old_store / "results.jsonl").read_bytes()
    contexts = sorted({(r["task"], r["item"], r.get("haystack")) for r in rows if r["code"] == OLD}, key=str)
    [sampled] = random.Random(0).sample(contexts, 1)  # as carry draws its sample: the other context is not rerun
    edited = [{**r, "answer_nll": r["answer_nll"] + 1e-2, "delta_nll": r["delta_nll"] + 1e-2}
              if r["code"] == OLD and r["press"] == "snapkv" and r["item"] != sampled[1] else r for r in rows]
    (old_store / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in edited))
    code, err = run_cli(capsys, "carry", old_store, "--sample", "1", "--model", model_dir)
    assert code == 2 and "is held twice" in err, err
    (old_store / "results.jsonl").write_bytes(kept)
    code, err = run_cli(capsys, "carry", old_store, "--sample", "1", "--model", model_dir)
    assert code == 0, err
    after = ResultStore(old_store, readonly=True).rows
    assert after == native
    assert run_cli(capsys, "verify", old_store)[0] == 0


@pytest.mark.parametrize("given", ["collection", "group folder"])
@pytest.mark.slow  # ~5 s each: publishes, then carries; CI's slow run holds it
def test_a_collection_is_carried_in_place(old_store, model_dir, tmp_path, capsys, given):
    """A collection, or one setting group's folder of it (what the leaderboard gate names: the collection may hold
    groups of another machine's text that cannot be carried here)."""
    collection = tmp_path / "results"
    assert run_cli(capsys, "publish", old_store, "--into", collection)[0] == 0
    files = sorted(p.relative_to(collection) for p in collection.rglob("results.jsonl.gz"))
    [group] = collection.iterdir()
    target = collection if given == "collection" else group
    packs = {path: path.read_bytes() for path in collection.rglob("results.jsonl.gz")}
    code, err = run_cli(capsys, "carry", target, "--sample", "1", "--model", model_dir)
    assert code == 0, err
    assert sorted(p.relative_to(collection) for p in collection.rglob("results.jsonl.gz")) == files
    # the files stay as they were: the group folder's record names the code their rows read under
    assert {path: path.read_bytes() for path in packs} == packs
    [record] = json.loads((group / CARRIED).read_text())
    assert record["from"] == OLD and record["to"] == code_version() and record["stores"] == sorted(
        p.parent.name for p in files)
    rows = ResultStore(collection / files[0].parent, readonly=True).rows
    assert {r["code"] for r in rows} == {code_version()} and {r["carried_from"] for r in rows} == {OLD}
    assert all(r["method_code"] == record["method_codes"][f"{r['press']}/{r['allocator']}"] for r in rows)
    assert run_cli(capsys, "verify", collection)[0] == 0
    if given == "group folder":  # a new method joins the group carried by its record: its own rows, its own file
        new = tmp_path / "new"
        run_compare(compare_settings(model_dir, new, presses=["kvzip"], keep_fractions=[0.3, 0.6], n=2),
                    show_progress=False)
        code, err = run_cli(capsys, "publish", new, "--into", collection)
        assert code == 0, err
        assert {path: path.read_bytes() for path in packs} == packs and (group / "kvzip--flat").is_dir()
        assert run_cli(capsys, "verify", collection)[0] == 0


def test_a_record_of_a_carried_group_reads_old_rows_as_the_new_code_and_nothing_else(tmp_path):
    """The record maps only the rows of its group, of its old shared code and of each method's old own code, in
    the stores it lists; a later record maps on from the earlier one's code; a damaged record is one line."""
    from bench.store.carried_codes import under_records

    group = {"model": "m", "length": 8, "code": "A", "seed": 0}
    rows = [{"model": "m", "length": 8, "code": "A", "seed": 0, "press": "p", "allocator": "flat", "method_code": "a"},
            {"model": "m", "length": 8, "code": "A", "seed": 0, "press": "p", "allocator": "flat", "method_code": "x"},
            {"model": "m", "length": 16, "code": "A", "seed": 0, "press": "p", "allocator": "flat", "method_code": "a"},
            {"model": "m", "length": 8, "code": "A", "seed": 0, "press": "q", "allocator": "flat", "method_code": "a"}]
    first = {"group": group, "from": "A", "to": "B", "method_codes_from": {"p/flat": "a"},
             "method_codes": {"p/flat": "b"}}
    second = {"group": {**group, "code": "B"}, "from": "B", "to": "C", "method_codes_from": {"p/flat": "b"},
              "method_codes": {"p/flat": "c"}}
    mapped = under_records([dict(r) for r in rows], [first, second])
    assert (mapped[0]["code"], mapped[0]["method_code"], mapped[0]["carried_from"]) == ("C", "c", "A")
    assert mapped[1:] == rows[1:]  # another own code, another group, another method: as they are
    folder = tmp_path / "group"
    (folder / "p--flat").mkdir(parents=True)
    written = {"group": {**group, "code": "a" * 12}, "from": "a" * 12, "to": "b" * 12,  # as a carry writes one
               "method_codes_from": {"p/flat": "a" * 12}, "method_codes": {"p/flat": "b" * 12},
               "contexts": [["t", 0, None]], "sample": 1, "seed": 0, "rows": 1, "stores": ["other"]}
    (folder / CARRIED).write_text(json.dumps([written]))
    from bench.store.carried_codes import carried_records

    assert carried_records(folder / "p--flat") == []
    (folder / CARRIED).write_text("[{")
    with pytest.raises(ValueError, match="carried.json: not a record of carried groups"):
        carried_records(folder / "p--flat")


def test_a_context_that_is_another_text_here_is_named_as_such(old_store, model_dir, capsys):
    """A rerun that builds another text of a context (a group of real text from before the haystacks were shipped
    snapshots read its machine's own files) says so, not that the numbers changed."""
    rows = [json.loads(line) for line in (old_store / "results.jsonl").read_text().splitlines()]
    for row in rows:
        row["context_sha"] = "0" * 16
    (old_store / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    code, err = run_cli(capsys, "carry", old_store, "--sample", "1", "--model", model_dir)
    assert code == 2 and "is another text here" in err and "digest 0000000000000000" in err, err


@pytest.mark.parametrize("make", ["a pipe", "a link to /dev/zero"])
def test_a_carried_record_that_is_no_regular_file_is_refused_not_read(tmp_path, capsys, make):
    """Probe 8: a group's carried.json made a pipe kept verify and leaderboard waiting until killed; made a link to
    /dev/zero, it was read until memory ran out. Every reader of the group's stores refuses it unread, in one line."""
    import os

    store = tmp_path / "group" / "store"
    store.mkdir(parents=True)
    (store / "results.jsonl").write_text("")
    record = tmp_path / "group" / CARRIED
    os.mkfifo(record) if make == "a pipe" else record.symlink_to("/dev/zero")
    code, err = run_cli(capsys, "verify", store)
    assert code == 2 and err.endswith(f"{record}: not a regular file, where the record of carried groups belongs; "
                                      "restore it from version control"), err


def test_a_group_folder_that_cannot_be_written_is_refused_before_any_context_is_rerun(old_store, model_dir, tmp_path,
                                                                                       capsys, monkeypatch):
    """Probe 10: a read-only group folder (``chattr +i``) let carry rerun its contexts, then end in a raw
    "[Errno 1] … .carried.json.*.tmp.json". The folder is named before any work (the test runs as root, whom mode
    bits do not stop: the folder is made unwritable where the bench asks)."""
    collection = tmp_path / "results"
    assert run_cli(capsys, "publish", old_store, "--into", collection)[0] == 0
    [group] = collection.iterdir()
    packs = {path: path.read_bytes() for path in collection.rglob("*") if path.is_file()}
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **k: Path(path) != group and access(path, mode, **k))
    monkeypatch.setattr(bench.run.carry, "_rerun", lambda *a, **k: pytest.fail("a context was rerun"))
    code, err = run_cli(capsys, "carry", collection, "--sample", "1", "--model", model_dir)
    assert code == 2 and err.splitlines()[-1].endswith(f"store {group / CARRIED}: {group} is not writable"), err
    assert {path: path.read_bytes() for path in collection.rglob("*") if path.is_file()} == packs


@pytest.mark.parametrize("where", ["store", "group folder"])
def test_a_linked_carried_record_is_refused_before_any_context_is_rerun(old_store, model_dir, tmp_path, capsys,
                                                                        monkeypatch, where):
    """Probe 12: carry renamed its record over a user's linked carried.json, in a store and in a collection's group
    folder: the link was gone. It is refused, as every output's link is, before any work."""
    if where == "group folder":
        assert run_cli(capsys, "publish", old_store, "--into", tmp_path / "results")[0] == 0
        [folder] = (tmp_path / "results").iterdir()
    else:
        folder = old_store
    mine = tmp_path / "mine.json"
    mine.write_text("[]\n")
    (folder / CARRIED).symlink_to(mine)
    files = {path: path.read_bytes() for path in folder.rglob("results.jsonl*")}
    monkeypatch.setattr(bench.run.carry, "_rerun", lambda *a, **k: pytest.fail("a context was rerun"))
    code, err = run_cli(capsys, "carry", folder, "--sample", "1", "--model", model_dir)
    assert code == 2 and err.endswith(f"store {folder}: holds a link at {folder / CARRIED} (to {mine}), where this "
                                      "command writes a file of its own; it never writes through a link nor replaces "
                                      "one (a file is put in place by renaming): move the link away, or give another "
                                      "store"), err
    assert (folder / CARRIED).is_symlink() and mine.read_text() == "[]\n"
    assert {path: path.read_bytes() for path in folder.rglob("results.jsonl*")} == files


@pytest.mark.parametrize("name, change", [(CARRIED, "+i"), (CARRIED, "+a"), ("results.jsonl", "+a")])
def test_a_protected_file_carry_rewrites_is_refused_before_any_context_is_rerun(old_store, model_dir, capsys,
                                                                              monkeypatch, chattr, name, change):
    """Probe 12: with carried.json protected, carry rewrote results.jsonl, then failed on the record in a bare
    errno (the carry's history lost); an append-only results.jsonl passed the check of a store's appender, though
    carry replaces it by rename. Both are named before any work."""
    path = old_store / name
    if not path.exists():
        path.write_text("[]\n")
    before = {each: each.read_bytes() for each in old_store.iterdir()}
    chattr(path, change)
    monkeypatch.setattr(bench.run.carry, "_rerun", lambda *a, **k: pytest.fail("a context was rerun"))
    code, err = run_cli(capsys, "carry", old_store, "--sample", "1", "--model", model_dir)
    attribute = "immutable (chattr +i)" if change == "+i" else "append-only (chattr +a)"
    assert code == 2 and err.endswith(f"{path} is {attribute}, which stops even root from changing it as this "
                                      f"command would: remove the attribute (chattr -{change[1]} {path}), or give "
                                      "another store"), err
    assert {each: each.read_bytes() for each in old_store.iterdir()} == before


@pytest.mark.slow  # ~7 s: a run at 512 tokens, then its carry; CI's slow run holds it
def test_a_task_that_reads_no_haystack_is_rerun_on_the_generated_text(model_dir, tmp_path, capsys, monkeypatch):
    """A group run with --haystack manpages holds vt rows, which record the generated haystack they ran on: a vt
    context is rerun alone, so without --haystack (which no task of it reads: refused, once)."""
    out = tmp_path / "store"
    monkeypatch.setattr(bench.run.plan, "code_version", lambda engine="hf": OLD)
    run_compare(compare_settings(model_dir, out, tasks=["niah_single_2", "vt"], haystack="manpages", length=512),
                show_progress=False)
    monkeypatch.undo()
    rows = ResultStore(out, readonly=True).rows
    assert {(r["task"], r["haystack"]) for r in rows} == {("niah_single_2", "manpages"), ("vt", "generated")}
    code, err = run_cli(capsys, "carry", out, "--sample", "2", "--model", model_dir)  # both contexts, vt's alone
    assert code == 0, err
    assert {r["code"] for r in ResultStore(out, readonly=True).rows} == {code_version()}


def test_a_model_of_other_weights_is_refused_before_any_context_is_rerun(old_store, model_dir, tmp_path, capsys,
                                                                          no_model_load):
    """Probe 17: ``--model`` of another model loaded it, reran every context and blamed the differing values on the
    code. The model's weights are compared with the rows' before any rerun."""
    from safetensors.torch import load_file, save_file

    other = shutil.copytree(model_dir, tmp_path / "other")
    for path in other.glob("*.safetensors"):
        tensors = load_file(path)
        name = sorted(tensors)[0]
        save_file({**tensors, name: tensors[name] + 1.0}, path, metadata={"format": "pt"})
    before = (old_store / "results.jsonl").read_bytes()
    code, err = run_cli(capsys, "carry", old_store, "--sample", "1", "--model", other)
    assert code == 2 and "but the rows of" in err and "were computed on weights" in err, err
    assert (old_store / "results.jsonl").read_bytes() == before

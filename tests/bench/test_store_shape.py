"""Stores that know their own shape: every row records its run (its tasks, n, haystack, its shard and the shard
count), so that ``bench verify`` and ``bench merge`` name a missing shard, shards of two splits, and the rows of
another run by their lines; every writer resumes a committed (compressed) store; every stored fraction is checked in
[0, 1]; ``bench compare``'s own summary passes the checks ``bench verify`` applies."""

import gzip
import json
import os
import re
import shutil

import pytest

import bench.run.compare
import bench.run.plan
from allocators.integerize import round_half_up
from bench.commands.cli import main
from bench.run.compare import CompareSettings, run_compare, run_rows
from bench.store.result_store import ResultStore
from pretrained import loading
from runtime.errors import UsageError
from tests.helpers import assert_reports_refuse, published_stores, run_cli, store_of, stored_rows

SETTINGS = dict(presses=["keydiff", "none"], allocators=["flat"], keep_fractions=[0.5], tasks=["niah_single_1"],
                length=300)
RUN = {"tasks": ["niah_single_1"], "haystack": "generated"}
"""What every run of :data:`SETTINGS` records beside its n and shard."""


def _settings(model_dir, out, **change) -> CompareSettings:
    return CompareSettings(**{**SETTINGS, "model": str(model_dir), "out": out, **change})


@pytest.fixture(scope="module", autouse=True)
def one_code_version():
    """Every run of this module under one code version: they are compared across tests, and the code is not what
    they test (an edit of the sources while they run would start a new version)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bench.run.plan, "code_version", lambda engine="hf": "c0dec0dec0de")
        yield


@pytest.fixture(scope="module")
def runs(model_dir, tmp_path_factory):
    """Shards 0/2, 1/2 and 0/3 of one run of four contexts, and a whole run of two contexts."""
    root = tmp_path_factory.mktemp("runs")
    for k, count in ((0, 2), (1, 2), (0, 3)):
        run_compare(_settings(model_dir, root / f"{k}of{count}", n=4, shard=(k, count)), show_progress=False)
    run_compare(_settings(model_dir, root / "whole", n=2), show_progress=False)
    return root




def test_every_row_records_its_run(runs):
    rows = stored_rows(runs / "1of2")
    assert rows and all(row["run"] == {**RUN, "n": 4, "shard": 1, "shards": 2} for row in rows)
    assert {row["item"] for row in rows} == {1, 3}  # positions 1 and 3 of the run's four contexts
    assert all(row["run"] == {**RUN, "n": 2, "shard": 0, "shards": 1} for row in stored_rows(runs / "whole"))


def test_rows_written_now_name_the_recurrent_state_bytes(runs):
    """Each row records its child's attention cache (``kv_bytes``) and recurrent state (``recurrent_bytes``: GDN and
    Mamba2 layers alike; ``gdn_bytes`` only in stores written before, read under the new name): the state is copied
    whole into every child, so it is the full cache's in every row of a context, while a child keeps fewer entries."""
    rows = stored_rows(runs / "whole")
    assert rows and not any("gdn_bytes" in row for row in rows)
    for item in {row["item"] for row in rows}:
        own = [row for row in rows if row["item"] == item]
        full = next(row for row in own if row["press"] == "none")
        assert full["recurrent_bytes"] > 0 and all(row["recurrent_bytes"] == full["recurrent_bytes"] for row in own)
        assert all(0 < row["kv_bytes"] < full["kv_bytes"] for row in own if row["press"] != "none")


def test_the_shards_of_one_split_merge_and_verify(runs, tmp_path, capsys):
    code, err = run_cli(capsys, "verify", runs / "0of2", runs / "1of2")
    assert code == 0, err
    assert run_cli(capsys, "merge", runs / "0of2", runs / "1of2", "--out", tmp_path / "merged")[0] == 0
    code, err = run_cli(capsys, "verify", tmp_path / "merged")
    assert code == 0, err


def test_merge_refuses_shards_of_two_splits(runs, tmp_path, capsys):
    code, err = run_cli(capsys, "merge", runs / "0of2", runs / "0of3", "--out", tmp_path / "merged")
    assert code == 2 and f"{runs / '0of2' / 'results.jsonl'} holds shard 0/2 and {runs / '0of3' / 'results.jsonl'} " \
                          "shard 0/3" in err, err
    assert "shards of one run are of one --shard K/N split" in err
    assert not (tmp_path / "merged" / "results.jsonl").exists()


@pytest.mark.parametrize("first, second, differ", [
    ((2, (0, 2)), (2, (1, 3)), "{a} holds shard 0/2 and {b} shard 1/3: the shards of one run are of one --shard K/N "
                               "split (one N); merge the stores of one split"),
    ((3, (0, 2)), (2, (1, 2)), "{a} and {b} are not shards of one run: they differ in run n (3 against 2)"),
])
def test_verify_refuses_the_shards_merge_refuses_as_merge_does(model_dir, tmp_path, capsys, first, second, differ):
    """Shards that together hold every context of each run they name, so that no context is missing: of two splits
    of one run (items 0 and 1 of two: shard 0/2 holds item 0, shard 1/3 item 1), or of two runs (items 0 and 2 of
    three, item 1 of two). ``bench verify`` refuses them with the line ``bench merge`` refuses them with."""
    for name, (n, shard) in (("a", first), ("b", second)):
        run_compare(_settings(model_dir, tmp_path / name, n=n, shard=shard), show_progress=False)
    a, b = tmp_path / "a", tmp_path / "b"
    expected = differ.format(a=a / "results.jsonl", b=b / "results.jsonl")
    for argv in (["merge", a, b, "--out", tmp_path / "merged"], ["verify", a, b]):
        code, err = run_cli(capsys, *argv)
        assert code == 2 and expected in err, err
    assert not (tmp_path / "merged" / "results.jsonl").exists()


@pytest.mark.parametrize("command", ["merge", "verify"])
def test_a_missing_shard_is_named(runs, tmp_path, capsys, command):
    argv = [command, runs / "0of2"] + (["--out", tmp_path / "merged"] if command == "merge" else [])
    code, err = run_cli(capsys, *argv)
    assert code == 2 and "shard 1/2 is missing: no row holds task niah_single_1, item 1, task niah_single_1, " \
                          "item 3" in err, err
    assert not (tmp_path / "merged" / "results.jsonl").exists()


@pytest.mark.parametrize("command", ["merge", "verify", "leaderboard"])
def test_a_run_of_very_many_contexts_is_checked_without_listing_them(runs, tmp_path, capsys, command):
    """Rows of a run of ``--n 100000000`` (stopped early) are named incomplete at once: the missing contexts are
    counted, not listed (listing them took 24 GB)."""
    rows = [{**row, "run": {**row["run"], "n": 10**8}} for row in stored_rows(runs / "0of2")]
    store = store_of(rows, tmp_path / "huge")
    argv = {"merge": ["merge", store, "--out", tmp_path / "merged"], "verify": ["verify", store],
            "leaderboard": ["leaderboard", store, "--out", tmp_path / "docs"]}[command]
    code, err = run_cli(capsys, *argv)
    if command == "merge":  # merge checks the shards it is given: shard 0 stopped after item 2
        expected = "no row holds task niah_single_1, item 4 (shard 0/2) of its run (items 0 … 99999999 of"
    else:
        expected = (f"shard 1/2 is missing: no row holds task niah_single_1, item 1, task niah_single_1, item 3, task "
                    f"niah_single_1, item 5, task niah_single_1, item 7, task niah_single_1, item 9, … "
                    f"({10**8 // 2 - 5} more)")
    assert code == 2 and expected in err, err


@pytest.mark.parametrize("command", ["merge", "verify"])
def test_a_split_into_far_more_shards_than_contexts_is_checked_by_its_contexts(runs, tmp_path, capsys, command):
    """Shards 0 and 1 of ``--shard K/1000000000000`` hold the run's two contexts, every other shard none: checking
    that every shard is there costs the contexts, not the shards (it looped over 10¹² shard indices)."""
    rows = stored_rows(runs / "whole")
    stores = [store_of([{**row, "run": {**row["run"], "shard": row["item"], "shards": 10**12}} for row in rows
                        if row["item"] == k], tmp_path / f"s{k}") for k in (0, 1)]
    argv = ["merge", *stores, "--out", tmp_path / "merged"] if command == "merge" else ["verify", *stores]
    code, err = run_cli(capsys, *argv)
    assert code == 0, err
    code, err = run_cli(capsys, "verify", stores[0])
    assert code == 2 and "shard 1/1000000000000 is missing: no row holds task niah_single_1, item 1" in err, err


def test_a_store_of_two_splits_names_the_missing_shard_and_both_splits(runs, tmp_path, capsys):
    mixed = store_of(stored_rows(runs / "0of2") + stored_rows(runs / "0of3"), tmp_path / "mixed")
    path, first = mixed / "results.jsonl", len(stored_rows(runs / "0of2"))
    code, err = run_cli(capsys, "verify", mixed)
    assert code == 2 and f"{path}:1-{first} (shard 0/2) and {path}:{first + 1}-{2 * first} (shard 0/3)" in err, err
    assert "task niah_single_1, item 1 is in neither" in err and "one --shard K/N split" in err


def test_a_row_outside_its_shard_is_named_by_its_line(runs, tmp_path, capsys):
    rows = stored_rows(runs / "0of2")
    rows[2]["run"] = {**rows[2]["run"], "shard": 1}
    bad = store_of(rows, tmp_path / "bad")
    code, err = run_cli(capsys, "verify", bad)
    assert code == 2 and f"{bad / 'results.jsonl'}:3: task niah_single_1, item {rows[2]['item']} (position " \
                         f"{rows[2]['item']} of its run) is not a context of shard 1/2" in err, err


def test_a_row_of_another_code_version_is_named_by_its_line_even_after_a_rerun(runs, model_dir, tmp_path, capsys):
    rows = stored_rows(runs / "whole")
    at = next(i for i, row in enumerate(rows) if row["press"] != "none" and row["item"] == 1)
    rows[at]["code"] = "0a0e00c0de00"
    store = store_of(rows, tmp_path / "store")
    for rerun in (False, True):
        if rerun:  # the gap the odd row left in its run is filled: the odd row stays odd
            run_compare(_settings(model_dir, store, n=2), show_progress=False)
            assert len(stored_rows(store)) == len(rows) + 1
        expected = f"{store / 'results.jsonl'}:{at + 1} (1 row of code 0a0e00c0de00; the other " \
                   f"{len(rows) - 1 + rerun} rows are of code c0dec0dec0de)"
        code, err = run_cli(capsys, "verify", store)
        assert code == 2 and expected in err and "remove it (or keep it in another store)" in err, err
    code, err = run_cli(capsys, "leaderboard", store, "--out", tmp_path / "docs")
    assert code == 2 and expected in err, err
    assert not (tmp_path / "docs" / "leaderboard.md").exists()


def test_rows_without_their_run_are_checked_as_before(runs, tmp_path, capsys):
    """Rows written before runs were recorded (with neither their questions' count nor their batch, as every store
    published before then) are checked context by context, alone or beside rows that record theirs."""
    rows = stored_rows(runs / "whole")
    legacy = [{k: v for k, v in row.items() if k not in ("run", "questions", "batch")} for row in rows]
    for name, stored in (("legacy", legacy), ("mixed", legacy[: len(rows) // 2] + rows[len(rows) // 2:])):
        code, err = run_cli(capsys, "verify", store_of(stored, tmp_path / name))
        assert code == 0, err
    holed = store_of(legacy[:-1], tmp_path / "holed")
    code, err = run_cli(capsys, "verify", holed)
    assert code == 2 and f"{holed / 'results.jsonl'} is incomplete: task niah_single_1, item 1 lacks" in err, err


@pytest.mark.slow  # ~16 s: it reads the whole collection; CI's slow run holds it
def test_the_committed_store_records_every_run_and_is_complete():
    """Every published row records its run (the byte model's, one process a run: n = 20 a task; the distilled
    hybrid's, rerun on the shipped snapshots: two shards, n = 30 at 2,048 and at 4,096 tokens; SmolLM2-instruct's,
    two shards, n = 20), and every group is complete. Rows of before runs were recorded are checked by the test
    above, on a real run's rows stripped of their record."""
    from bench.store.completeness import check_complete

    stores = published_stores()
    rows = [row for store in stores for row in store.rows]
    assert all("run" in row for row in rows)
    runs = {(row["run"]["n"], row["run"]["shards"]) for row in rows}
    assert runs == {(20, 1), (20, 2), (30, 2)}
    check_complete(stores)


def test_every_store_the_documents_hold_verifies(capsys):
    """The stores docs/ pages rebuild their tables from (``bench leaderboard DIR``), outside the collection: each
    passes ``bench verify`` under this checkout (probe 21, #4: one held a label an older bench wrote)."""
    from bench.store.project_modules import ROOT

    stores = sorted(path.parent for path in (ROOT / "docs").rglob("results.jsonl.gz")
                    if (ROOT / "docs" / "results") not in path.parents)
    assert len(stores) >= 10
    for store in stores:
        code, err = run_cli(capsys, "verify", store)
        assert code == 0, err


def _packed(source, directory):
    """``source``'s store as a committed one: ``results.jsonl.gz`` alone in ``directory``."""
    directory.mkdir()
    (directory / "results.jsonl.gz").write_bytes(gzip.compress((source / "results.jsonl").read_bytes()))
    return directory


def test_compare_resumes_a_committed_compressed_store(runs, model_dir, tmp_path, capsys):
    committed = _packed(runs / "whole", tmp_path / "committed")
    packed = (committed / "results.jsonl.gz").read_bytes()
    argv = ["compare", "--model", model_dir, "--out", committed, "--press", "keydiff", "--keep-fractions", "0.5",
            "--tasks", "niah_single_1", "--length", "300"]
    code, err = run_cli(capsys, *argv, "--n", "2")  # nothing left to run: nothing written to the store
    assert code == 0 and not (committed / "results.jsonl").exists(), err
    code, err = run_cli(capsys, *argv, "--n", "3")
    assert code == 0, err
    live = (committed / "results.jsonl").read_bytes()
    assert (committed / "results.jsonl.gz").read_bytes() == packed and live.startswith(gzip.decompress(packed))
    rows = ResultStore(committed, readonly=True).rows
    assert {row["item"] for row in rows} == {0, 1, 2} and len(rows) == 3 * len(stored_rows(runs / "whole")) // 2
    assert "Items per task: niah_single_1 3." in (committed / "summary.md").read_text()
    assert run_cli(capsys, "verify", committed)[0] == 0


def test_a_run_grown_to_a_larger_n_must_hold_every_context_of_it(runs, model_dir, tmp_path, capsys):
    """A store grown in place (the same run with a larger --n, as the GateSight group's multikey parts grew) keeps
    its first rows under the smaller n and answers only the new contexts; it is whole only with every context of
    the larger n, whichever n the rows of a context record."""
    grown = tmp_path / "grown"
    shutil.copytree(runs / "whole", grown)
    run_compare(_settings(model_dir, grown, n=4), show_progress=False)
    rows = stored_rows(grown)
    assert {(row["item"], row["run"]["n"]) for row in rows} == {(0, 2), (1, 2), (2, 4), (3, 4)}
    assert run_cli(capsys, "verify", grown)[0] == 0
    holed = store_of([row for row in rows if row["item"] != 2], tmp_path / "holed")
    code, err = run_cli(capsys, "verify", holed)
    assert code == 2 and "is incomplete: no row holds task niah_single_1, item 2 of its run (items 0 … 3" in err, err


def test_a_committed_store_with_a_cut_last_line_stays_readable_after_its_resume(runs, model_dir, tmp_path, capsys):
    """A ``.gz`` of a killed run's rows (its last line cut short): the resume drops that line from its copy, and
    the copy still counts as continuing the ``.gz`` — verify and later resumes read it."""
    committed = tmp_path / "committed"
    committed.mkdir()
    whole = (runs / "whole" / "results.jsonl").read_bytes()
    (committed / "results.jsonl.gz").write_bytes(gzip.compress(whole[:-100]))
    argv = ["compare", "--model", model_dir, "--out", committed, "--press", "keydiff", "--keep-fractions", "0.5",
            "--tasks", "niah_single_1", "--length", "300"]
    for n in ("3", "4"):
        code, err = run_cli(capsys, *argv, "--n", n)
        assert code == 0, err
    code, err = run_cli(capsys, "verify", committed)
    assert code == 0, err
    assert {row["item"] for row in ResultStore(committed, readonly=True).rows} == {0, 1, 2, 3}


@pytest.mark.parametrize("change, done", [
    (lambda live, packed: live.unlink(), "results.jsonl was removed"),
    (lambda live, packed: live.write_bytes(b""), "results.jsonl was changed"),  # by an older copy, without the row
    (lambda live, packed: packed.write_bytes(b"other"), "results.jsonl.gz was created"),
])
def test_a_store_moved_under_its_writer_stops_it_before_the_next_row(runs, tmp_path, change, done):
    """Another process that removes or rewrites the store's files while a writer holds it (an unpack, a checkout)
    is seen at the writer's next row: nothing lands in a new file that holds only the rows after it."""
    rows = stored_rows(runs / "whole")
    store = ResultStore(tmp_path)
    store.append(rows[0])
    change(tmp_path / "results.jsonl", tmp_path / "results.jsonl.gz")
    with pytest.raises(UsageError, match=f"{tmp_path / done} by another process while this run"):
        store.append(rows[1])
    store.close()


def test_a_committed_store_replaced_before_the_first_row_stops_its_writer(runs, tmp_path):
    """Probe 63: a ``.gz`` swapped (a checkout) while its writer still read from it was copied in, and the rows it
    held beyond the one read were answered and written again."""
    rows = stored_rows(runs / "whole")
    packed = tmp_path / "results.jsonl.gz"
    packed.write_bytes(gzip.compress("".join(json.dumps(row) + "\n" for row in rows[:2]).encode()))
    store = ResultStore(tmp_path)
    packed.write_bytes(gzip.compress("".join(json.dumps(row) + "\n" for row in rows[:5]).encode()))
    with pytest.raises(UsageError, match=f"{packed} was changed by another process"):
        store.append(rows[2])
    assert not (tmp_path / "results.jsonl").exists()
    store.close()


@pytest.mark.parametrize("touch", [lambda live: os.utime(live), lambda live: os.chmod(live, 0o600),
                                   lambda live: os.link(live, live.with_name("backup"))])
def test_a_change_of_a_stores_metadata_alone_does_not_stop_its_writer(runs, tmp_path, touch):
    """Probe 63: a touch, a chmod or a backup's hard link stopped a sweep, though no row changed."""
    rows = stored_rows(runs / "whole")
    store = ResultStore(tmp_path / "store")
    store.append(rows[0])
    touch(tmp_path / "store" / "results.jsonl")
    store.append(rows[1])
    store.close()
    assert len(ResultStore(tmp_path / "store", readonly=True).rows) == 2


def test_a_store_beside_a_committed_one_that_does_not_continue_it_is_refused(runs, model_dir, tmp_path, capsys):
    committed = _packed(runs / "whole", tmp_path / "committed")
    shutil.copy(runs / "0of2" / "results.jsonl", committed / "results.jsonl")
    before = {path.name: path.read_bytes() for path in committed.iterdir()}
    message = f"{committed / 'results.jsonl'} does not continue {committed / 'results.jsonl.gz'}"
    for argv in (["verify", committed], ["leaderboard", committed, "--out", tmp_path / "docs"],
                 ["merge", runs / "0of2", runs / "1of2", "--out", committed],
                 ["compare", "--model", model_dir, "--out", committed, "--press", "keydiff", "--keep-fractions", "0.5",
                  "--tasks", "niah_single_1", "--length", "300", "--n", "3"]):
        code, err = run_cli(capsys, *argv)
        assert code == 2 and message in err, err
    assert {path.name: path.read_bytes() for path in committed.iterdir() if path.name != ".lock"} == before


@pytest.mark.parametrize("copy, message", [
    (lambda row: {**row, "kl": row["kl"] + 0.25}, "with other values (kl "),
    (lambda row: dict(row), "a report would count it twice"),
])
def test_compare_refuses_to_resume_a_store_verify_refuses(runs, model_dir, tmp_path, capsys, monkeypatch, copy,
                                                          message):
    rows = stored_rows(runs / "whole")
    at = next(i for i, row in enumerate(rows) if row["press"] != "none")
    store = store_of([*rows, copy(rows[at])], tmp_path / "store")
    monkeypatch.setattr(loading, "load", lambda *a, **k: pytest.fail("loaded the model before checking the store"))
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--out", store, "--press", "keydiff",
                        "--keep-fractions", "0.5", "--tasks", "niah_single_1", "--length", "300", "--n", "2")
    assert code == 2 and f"{store / 'results.jsonl'}:{at + 1} and {store / 'results.jsonl'}:{len(rows) + 1}" in err
    assert message in err and not (store / "summary.md").exists()
    with pytest.raises(ValueError, match=re.escape(message)):  # nor does the library's summary read it
        run_rows(ResultStore(store, readonly=True), _settings(model_dir, store, n=2))


@pytest.mark.parametrize("change, message", [
    ({"needle_recall": 1.5}, "needle_recall=1.5 (expected a number in [0, 1])"),
    ({"answer_recall": 7.0}, "answer_recall=7.0 (expected a number in [0, 1])"),
    ({"answer_recall": "all"}, "answer_recall='all' (expected a number in [0, 1])"),
    ({"needle_recall_layers": {"1": [0.5, 1.5]}}, "needle_recall_layers['1'][1]=1.5 (expected a number in [0, 1])"),
    ({"answer_recall_layers": {"1": [-0.25]}}, "answer_recall_layers['1'][0]=-0.25 (expected a number in [0, 1])"),
    ({"answer_rank_layers": {"3": [2.0]}}, "answer_rank_layers['3'][0]=2.0 (expected a number in [0, 1])"),
    ({"answer_rank_layers": [0.5]}, "answer_rank_layers=[0.5] (expected {layer: [a number in [0, 1] per head]}, not "
                                    "empty)"),
])
def test_every_stored_fraction_is_checked(runs, tmp_path, capsys, change, message):
    rows = stored_rows(runs / "whole")
    at = next(i for i, row in enumerate(rows) if row.get("answer_recall") is not None)
    rows[at] = {**rows[at], **change}
    bad = store_of(rows, tmp_path / "bad")
    assert_reports_refuse(capsys, bad, tmp_path / "docs", f"{bad / 'results.jsonl'}:{at + 1}: {message}")


def test_a_store_given_twice_is_one_clear_error(runs, tmp_path, capsys):
    from bench.reports.leaderboard import write_leaderboard
    from bench.reports.verify import verify_stores

    for check in (lambda: verify_stores([runs / "whole", runs / "whole" / "."]),
                  lambda: write_leaderboard([runs / "whole", runs / "whole"], tmp_path / "docs")):
        with pytest.raises(ValueError, match=f"^{runs / 'whole'} is given twice; give each store once$"):
            check()
    for argv in (["verify", runs / "whole", runs / "whole" / "."],
                 ["leaderboard", runs / "whole", runs / "whole", "--out", tmp_path / "docs"]):
        capsys.readouterr()
        code = main(list(map(str, argv)))
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and f"{runs / 'whole'} is " in err and " twice" in err, err
    assert not (tmp_path / "docs" / "leaderboard.md").exists()


def test_an_empty_docs_folder_is_one_clear_error(runs, tmp_path, capsys):
    from bench.reports.verify import verify_stores

    docs = tmp_path / "docs"
    docs.mkdir()
    with pytest.raises(ValueError, match=f"^--docs {docs} holds no published leaderboard"):
        verify_stores([runs / "whole"], docs)
    capsys.readouterr()
    code = main(["verify", str(runs / "whole"), "--docs", str(docs)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"bench verify: error: --docs {docs} holds no published leaderboard")
    assert f"`bench leaderboard STORES --out {docs}` writes" in err
    assert list(docs.iterdir()) == []


def test_verify_names_shards_of_other_methods_as_merge_does(runs, tmp_path, capsys):
    """Shard 0/2 of one press and shard 1/2 of another, of otherwise one run, hold every context of it: ``bench
    verify`` refuses them with the line ``bench merge`` refuses them with (their methods differ), not as a run that
    stopped."""
    renamed = [{**row, "press": "snapkv"} if row["press"] == "keydiff" else row for row in stored_rows(runs / "0of2")]
    z0 = store_of(renamed, tmp_path / "z0")
    z1k = runs / "1of2"
    expected = (f"{z0 / 'results.jsonl'} and {z1k / 'results.jsonl'} are not shards of one run: they differ in methods "
                "(none p=1, snapkv/flat p=0.5 against keydiff/flat p=0.5, none p=1)")
    for argv in (["merge", z0, z1k, "--out", tmp_path / "merged"], ["verify", z0, z1k]):
        code, err = run_cli(capsys, *argv)
        assert code == 2 and expected in err and "rerun" not in err, err
    assert not (tmp_path / "merged" / "results.jsonl").exists()


def test_runs_of_other_methods_on_the_same_contexts_merge(runs, model_dir, tmp_path, capsys):
    """The leaderboard of two runs of other methods on one set of contexts refuses their shared no-prune rows and
    advises bench merge; merge joins them, keeping those rows once, and the merged store verifies."""
    other = tmp_path / "snapkv"
    run_compare(_settings(model_dir, other, n=2, presses=["snapkv", "none"]), show_progress=False)
    code, err = run_cli(capsys, "leaderboard", runs / "whole", other, "--out", tmp_path / "docs")
    assert code == 2 and "bench merge joins stores, keeping one" in err, err
    code, err = run_cli(capsys, "merge", runs / "whole", other, "--out", tmp_path / "merged")
    assert code == 0, err
    merged, whole, snap = stored_rows(tmp_path / "merged"), stored_rows(runs / "whole"), stored_rows(other)
    baseline = [row for row in whole if row["press"] == "none"]
    assert len(merged) == len(whole) + len(snap) - len(baseline)
    assert sorted(row["press"] for row in merged if row["press"] == "none") == ["none"] * len(baseline)
    code, err = run_cli(capsys, "verify", tmp_path / "merged")
    assert code == 0, err
    unfinished = store_of([row for row in snap if row["item"] == 0], tmp_path / "unfinished")
    code, err = run_cli(capsys, "merge", runs / "whole", unfinished, "--out", tmp_path / "merged2")
    assert code == 2 and "is incomplete" in err, err


@pytest.mark.parametrize("change", ["hand-written", "edited", "an image of its name"])
def test_a_leaderboard_is_never_rebuilt_over_a_file_it_did_not_write(runs, tmp_path, capsys, change):
    """``bench leaderboard --out DIR`` rebuilds leaderboard.md (and its tables and images) whole: over a file written
    (or edited since) by hand it would lose it; it is refused, and a folder it built itself is rebuilt as before."""
    docs = tmp_path / "docs"
    name = "leaderboard-2.png" if change == "an image of its name" else "leaderboard.md"
    if change == "edited":
        assert run_cli(capsys, "leaderboard", runs / "whole", "--out", docs)[0] == 0
        assert run_cli(capsys, "leaderboard", runs / "whole", "--out", docs)[0] == 0  # its own build: rebuilt
        (docs / name).write_text((docs / name).read_text() + "\nOur notes.\n")
    else:
        docs.mkdir()
        (docs / name).write_text("# Our notes\n")
    kept = (docs / name).read_text()
    code, err = run_cli(capsys, "leaderboard", runs / "whole", "--out", docs)
    assert code == 2 and f"{name} there was not written by bench leaderboard as it is now" in err, err
    assert (docs / name).read_text() == kept
    if change == "edited":  # verify's advice is the one that works: move it aside first
        code = main(["verify", str(runs / "whole"), "--docs", str(docs)])  # the error ends with the diff's lines
        err = capsys.readouterr().err
        assert code == 2 and "edited by hand since it was built: move it aside" in err, err


def test_a_sharded_run_merges_with_a_run_of_other_methods_once_its_shards_are_merged(runs, model_dir, tmp_path,
                                                                                      capsys):
    """Shards 0/2 and 1/2 of one method and a whole run of another on the same contexts: merging all three at once
    says to merge the shards first; then the merged shards and the other run merge (their splits differ), and a
    finished run whose methods are among the other's merges too (it is not called unfinished)."""
    other = tmp_path / "snapkv"
    run_compare(_settings(model_dir, other, n=4, presses=["snapkv", "none"]), show_progress=False)
    code, err = run_cli(capsys, "merge", runs / "0of2", runs / "1of2", other, "--out", tmp_path / "all")
    assert code == 2 and "merge the shards of each run first (bench merge SHARDS --out RUN), then merge the runs" \
        in err, err
    assert run_cli(capsys, "merge", runs / "0of2", runs / "1of2", "--out", tmp_path / "keydiff")[0] == 0
    code, err = run_cli(capsys, "merge", tmp_path / "keydiff", other, "--out", tmp_path / "both")
    assert code == 0, err
    assert run_cli(capsys, "verify", tmp_path / "both")[0] == 0
    code, err = run_cli(capsys, "merge", tmp_path / "both", other, "--out", tmp_path / "again")
    assert code == 0 and "did not finish" not in err, err
    assert len(stored_rows(tmp_path / "again")) == len(stored_rows(tmp_path / "both"))


def test_a_store_of_two_seeds_says_its_items_pool_both(runs, model_dir, tmp_path, capsys):
    """Runs of one setting with --seed 0 and --seed 1 in one store: their contexts differ, so the leaderboard pools
    their items (each paired across methods within its own context) and says which seeds it pools; compare's own
    summary describes its run alone (``bench.run.compare.run_rows``)."""
    store = tmp_path / "seeds"
    shutil.copytree(runs / "whole", store)
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--out", store, "--press", "keydiff",
                        "--keep-fractions", "0.5", "--tasks", "niah_single_1", "--length", "300", "--n", "2",
                        "--seed", "1")
    assert code == 0, err
    assert {row["seed"] for row in ResultStore(store, readonly=True).rows} == {0, 1}
    assert "Items per task: niah_single_1 2." in (store / "summary.md").read_text()
    assert run_cli(capsys, "leaderboard", store, "--out", tmp_path / "board")[0] == 0
    board = (tmp_path / "board" / "leaderboard.md").read_text()
    assert "Items per task: niah_single_1 4 (contexts drawn with seeds 0, 1, pooled)." in board, board


def test_runs_of_other_contexts_are_named_as_such_with_advice_that_works(runs, model_dir, tmp_path, capsys):
    """A run of snapkv on 1 context beside the keydiff run of 2: both whole, but a report compares methods on the
    same contexts. merge, verify and leaderboard say so (not "stopped before finishing; rerun it", which changes
    nothing), and what they advise works: each store reported alone, or snapkv run into the other run's store."""
    other = tmp_path / "snapkv"
    run_compare(_settings(model_dir, other, presses=["snapkv", "none"], n=1), show_progress=False)
    said = "holds runs of other contexts: snapkv/flat p=0.5 was run on tasks niah_single_1, n 1, not on task " \
           "niah_single_1, item 1, which a run of tasks niah_single_1, n 2 holds; a report compares methods on " \
           "the same contexts: run the methods with the same --tasks and --n into one store"
    for argv in (["verify", other, runs / "whole"], ["leaderboard", other, runs / "whole", "--out", tmp_path / "lb"]):
        code, err = run_cli(capsys, *argv)
        assert code == 2 and said in err and "stopped before finishing" not in err, err
    code, err = run_cli(capsys, "merge", other, runs / "whole", "--out", tmp_path / "merged")
    assert code == 2 and "differ in run n" in err and "a report compares methods on the same contexts" in err, err
    assert run_cli(capsys, "verify", other)[0] == 0 and run_cli(capsys, "verify", runs / "whole")[0] == 0
    both = tmp_path / "both"
    shutil.copytree(runs / "whole", both)
    run_compare(_settings(model_dir, both, presses=["snapkv", "none"], n=2), show_progress=False)
    code, err = run_cli(capsys, "verify", both)
    assert code == 0, err


def test_a_rerun_under_another_code_version_says_it_starts_anew(runs, model_dir, tmp_path, capsys, monkeypatch):
    """After a code change a rerun cannot resume the rows the older code wrote (a row records its code): it says so
    before it redoes the contexts, and a run of the same code says nothing."""
    store = tmp_path / "store"
    shutil.copytree(runs / "whole", store)
    run_compare(_settings(model_dir, store, n=2), show_progress=False)  # nothing left to run, same code
    assert "note:" not in capsys.readouterr().err
    monkeypatch.setattr(bench.run.plan, "code_version", lambda engine="hf": "0a0e00c0de00")
    run_compare(_settings(model_dir, store, n=2), show_progress=False)
    count = len(stored_rows(runs / "whole"))
    assert f"note: {store / 'results.jsonl'} holds {count} rows of this model and settings computed by another code " \
           f"version (c0dec0dec0de): they are kept, and reported apart from this run's; this run (code " \
           f"0a0e00c0de00) does not resume them and starts anew" in capsys.readouterr().err
    assert len(stored_rows(store)) == 2 * count


@pytest.mark.parametrize("presses, n, said", [
    (["snapkv", "none"], 3, "holds rows of keydiff/flat p=0.5 in this setting group, and this run would answer task "
                            "niah_single_1, item 2 without them"),
    (["snapkv", "none"], 1, "holds task niah_single_1, item 1, which this run does not answer (--tasks "
                            "niah_single_1, --n 1), and it would lack the rows of snapkv/flat p=0.5"),
])
def test_a_run_that_would_leave_its_store_incomplete_is_refused_before_any_work(runs, model_dir, tmp_path, capsys,
                                                                                monkeypatch, presses, n, said):
    """A run whose rows, once written, a verify would refuse (every context of a setting group holds every method of
    it) is refused before the model loads, naming the context and the methods, and the store is left as it was."""
    store = tmp_path / "store"
    shutil.copytree(runs / "whole", store)
    before = (store / "results.jsonl").read_bytes()
    monkeypatch.setattr(bench.run.compare, "_run", lambda *args: pytest.fail("the run started"))
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--methods", ",".join(f"{p}/flat" for p in presses
                                                                                      if p != "none"),
                        "--keep-fractions", "0.5", "--tasks", "niah_single_1", "--length", 300, "--n", n,
                        "--out", store)
    assert code == 2 and said in err and "or write to another --out" in err, err
    assert (store / "results.jsonl").read_bytes() == before


@pytest.mark.parametrize("presses, n", [(["keydiff", "none"], 3), (["keydiff", "snapkv", "none"], 2),
                                        (["keydiff", "snapkv", "none"], 3), (["keydiff", "none"], 1)])
def test_runs_that_keep_their_store_complete_are_not_refused(runs, model_dir, tmp_path, presses, n, monkeypatch):
    """More contexts of the same methods, more methods on the same contexts or on more, and a part of a finished
    run (a smaller --n) are fine: the store stays whole."""
    store = tmp_path / "store"
    shutil.copytree(runs / "whole", store)
    started = []
    monkeypatch.setattr(bench.run.compare, "_run", lambda *args: started.append(True))
    run_compare(_settings(model_dir, store, presses=presses, n=n), show_progress=False)
    assert started


@pytest.mark.parametrize("shard, said", [((0, 3), "holds shard 0/2 of this run (same --tasks, --n and --haystack), "
                                                  "and this one is shard 0/3"),
                                         (None, "and this one is shard 0/1")])
def test_a_shard_of_another_split_into_the_store_of_a_shard_is_refused(runs, model_dir, tmp_path, monkeypatch, shard,
                                                                       said):
    """Shard 0/3 of a run into the store of its shard 0/2 would answer item 3 twice over and never items of 1/3 and
    2/3: refused before any work, with the split to give; shard 1/2 of the same split goes in."""
    store = tmp_path / "store"
    shutil.copytree(runs / "0of2", store)
    before = (store / "results.jsonl").read_bytes()
    started = []
    monkeypatch.setattr(bench.run.compare, "_run", lambda *args: started.append(True))
    with pytest.raises(ValueError, match=re.escape(said) + ".*Give --shard K/2, or write to another --out"):
        run_compare(_settings(model_dir, store, n=4, shard=shard), show_progress=False)
    assert not started and (store / "results.jsonl").read_bytes() == before
    run_compare(_settings(model_dir, store, n=4, shard=(1, 2)), show_progress=False)
    assert started


def test_merge_of_one_run_under_two_code_versions_says_what_to_do(runs, model_dir, tmp_path, capsys, monkeypatch):
    """Two stores of the same run computed by two code versions are two results: merge refuses them naming the
    code versions and the ways out, as it does for runs of other contexts."""
    old = tmp_path / "old"
    monkeypatch.setattr(bench.run.plan, "code_version", lambda engine="hf": "0a0e00c0de00")
    run_compare(_settings(model_dir, old, n=2), show_progress=False)
    code, err = run_cli(capsys, "merge", runs / "whole", old, "--out", tmp_path / "merged")
    assert code == 2 and "differ in code (c0dec0dec0de against 0a0e00c0de00); rows of two code versions are two " \
                         "results, reported apart: keep each in its own store" in err, err
    assert not (tmp_path / "merged").exists()


def test_merge_stores_names_a_refused_out_by_its_argument(runs, tmp_path):
    from bench.store.merge import merge_stores

    with pytest.raises(ValueError, match=r"^out /proc/xx: /proc holds the kernel's virtual files"):
        merge_stores([runs / "whole"], "/proc/xx")


@pytest.mark.parametrize("presses, n, said", [
    (["snapkv", "none"], 2, "holds task niah_single_1, item 1 without the rows of keydiff/flat p=0.5 (the run that "
                            "wrote it stopped before them), and this run answers it without them"),
    (["keydiff", "none"], 1, "holds task niah_single_1, item 1, which this run does not answer (--tasks "
                             "niah_single_1, --n 1), and it would lack the rows of keydiff/flat p=0.5"),
])
def test_a_run_that_leaves_a_stopped_context_unfinished_is_refused(runs, model_dir, tmp_path, monkeypatch, presses,
                                                                   n, said):
    """A killed run left item 1 without its keydiff row: a run of other methods over it, or a smaller --n that
    leaves it out, would never finish it; resuming with keydiff on it does."""
    store = tmp_path / "store"
    store.mkdir()
    rows = stored_rows(runs / "whole")
    kept = [row for row in rows if not (row["item"] == 1 and row["press"] == "keydiff")]
    (store / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in kept))
    started = []
    monkeypatch.setattr(bench.run.compare, "_run", lambda *args: started.append(True))
    with pytest.raises(ValueError, match=re.escape(said)):
        run_compare(_settings(model_dir, store, presses=presses, n=n), show_progress=False)
    assert not started
    run_compare(_settings(model_dir, store, presses=["keydiff", "snapkv", "none"], n=2), show_progress=False)
    assert started


def test_seeds_of_other_methods_are_not_pooled_into_one_report(runs, model_dir, tmp_path, capsys):
    """keydiff on seed 0's contexts and snapkv on seed 1's: each seed's group is whole, but a report pools the
    seeds' items and would compare the two methods on different contexts. verify, the leaderboard and merge refuse
    it with the way out; the same method on both seeds still pools (above)."""
    store = tmp_path / "store"
    shutil.copytree(runs / "whole", store)
    run_compare(_settings(model_dir, store, presses=["snapkv", "none"], n=2, seed=1), show_progress=False)
    said = "(seed 0) lack the rows of snapkv/flat p=0.5, which the rows of seed(s) 1 of the same setting hold"
    assert_reports_refuse(capsys, store, tmp_path / "docs", said)
    code, err = run_cli(capsys, "merge", store, "--out", tmp_path / "merged")
    assert code == 2 and said in err and "Run those methods with --seed 0 too" in err, err


def test_a_shard_of_the_same_tasks_in_another_order_is_refused(runs, model_dir, tmp_path, monkeypatch):
    """A shard's contexts follow the order of --tasks: shard 1/2 of b,a after shard 0/2 of a,b would answer a
    context shard 0/2 held and leave one of a,b's shard 1/2 unanswered."""
    store = tmp_path / "store"
    tasks = ["niah_single_1", "niah_single_2"]
    monkeypatch.setattr(bench.run.compare, "_run", lambda *args: None)
    rows = [{**row, "run": {**row["run"], "tasks": tasks, "n": 4}} for row in stored_rows(runs / "0of2")]
    store_of(rows, store)
    with pytest.raises(ValueError, match="holds a run of --tasks niah_single_1,niah_single_2, and this shard is of "
                                         "--tasks niah_single_2,niah_single_1"):
        run_compare(_settings(model_dir, store, tasks=tasks[::-1], n=4, shard=(1, 2)), show_progress=False)
    run_compare(_settings(model_dir, store, tasks=tasks, n=4, shard=(1, 2)), show_progress=False)


def _child_of_item(item):
    return lambda row: row["item"] == item and row["press"] != "none"


def _context_resized(row, n_context=0, protected=0):
    """``row`` (a flat child) as a child of a context ``n_context`` tokens longer and protecting ``protected`` more,
    its own counts consistent: the entries chosen among, and its flat budget of them."""
    heads = row["body_entries"] // (row["n_context"] - row["protected"])
    n, kept = row["n_context"] + n_context, row["protected"] + protected
    return {**row, "n_context": n, "protected": kept, "body_entries": (n - kept) * heads,
            "kept_entries": round_half_up(row["keep_fraction"] * (n - kept)) * heads}


def _drop(*fields):
    return lambda row: {k: v for k, v in row.items() if k not in fields}


@pytest.mark.parametrize("which, change, message", [
    (lambda row: True, _drop("run"), "questions without run (expected run and questions together"),
    (lambda row: True, _drop("questions"), "run without questions (expected run and questions together"),
    (lambda row: row["item"] == 1, lambda row: {**row, "model_parts": {**row["model_parts"], "config": "other"}},
     "the fingerprint of its model_parts"),
    (lambda row: True, lambda row: {**row, "weights": "zzzzzzzzzzzz"}, "weights='zzzzzzzzzzzz' (expected '"),
    (_child_of_item(0), lambda row: _context_resized(row, n_context=-10), "(expected the no-prune row's"),
    (_child_of_item(0), lambda row: _context_resized(row, protected=1), "protected="),
    (_child_of_item(1), lambda row: {**row, "recurrent_bytes": row["recurrent_bytes"] + 4}, "recurrent_bytes="),
    (_child_of_item(1), _drop("needle_recall", "needle_recall_layers", "answer_recall", "answer_recall_layers",
                             "answer_rank_layers"), "no needle recall (needle_recall_layers, answer_recall_layers, "),
    (lambda row: row["item"] == 1, lambda row: {**row, "schema": 1}, "schema=1, where the row at"),
    (lambda row: True, lambda row: {**row, "dtype": "banana"}, "dtype='banana' (expected one of float32, bfloat16"),
    (lambda row: True, lambda row: {**row, "device": "toaster"}, "device='toaster' (expected cpu, cuda or cuda:N)"),
    (_child_of_item(0), lambda row: {**_drop("prediction")(row), "score": 1.0},
     "no prediction in a row that records its run"),
])
def test_rows_a_run_of_today_could_not_have_written_are_refused(runs, tmp_path, capsys, which, change, message):
    """Probe 61: rows of today's code with their run (or their questions) removed passed as rows from before runs
    were recorded, and hid a missing context; a weights fingerprint that is not its model parts' let two models
    share a group; a child's context sizes other than its no-prune row's, a child without the needle fields of its
    task's other children, a schema other than its code's, a dtype or device no run records, and a row without its
    prediction (its score then unchecked) all passed."""
    rows = [change(row) if which(row) else row for row in stored_rows(runs / "whole")]
    assert_reports_refuse(capsys, store_of(rows, tmp_path / "store"), tmp_path / "docs", message)

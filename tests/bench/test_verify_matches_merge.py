"""``bench verify`` applies every check ``bench merge`` applies (one key, one value; counts within the context's
size) and checks every file ``bench leaderboard`` publishes, the CSV and the images included."""

import shutil

import pytest

from bench.commands.cli import main
from bench.reports.leaderboard import MANIFEST, write_leaderboard
from bench.reports.verify import verify_stores
from bench.run.compare import CompareSettings, run_compare
from bench.store.merge import merge_stores
from tests.helpers import store_of, stored_rows


@pytest.fixture(scope="module")
def store(model_dir, tmp_path_factory):
    """A finished run of the tiny model: no prune and keydiff/flat at p = 0.5 on two contexts."""
    out = tmp_path_factory.mktemp("run")
    run_compare(CompareSettings(presses=["keydiff", "none"], allocators=["flat"], keep_fractions=[0.5],
                                tasks=["niah_single_1"], n=2, length=300, model=str(model_dir), out=out),
                show_progress=False)
    return out




def _cli(capsys, *argv) -> tuple[int, str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


def _compacted(rows) -> int:
    return next(i for i, row in enumerate(rows) if row["press"] != "none")


def test_a_key_held_twice_with_other_values_fails_verify_as_it_fails_merge(store, tmp_path, capsys):
    rows = stored_rows(store)
    at = _compacted(rows)
    flipped = {**rows[at], "kl": rows[at]["kl"] + 0.25}
    bad = store_of([*rows, flipped], tmp_path / "bad")
    for argv in (["verify", bad], ["merge", bad, "--out", tmp_path / "merged"],
                 ["leaderboard", bad, "--out", tmp_path / "docs"]):
        code, err = _cli(capsys, *argv)
        assert code == 2 and f"{bad / 'results.jsonl'}:{at + 1} and {bad / 'results.jsonl'}:{len(rows) + 1}" in err
        assert f"with other values (kl {rows[at]['kl']!r} and {flipped['kl']!r}): one key, one value" in err, err
    assert not (tmp_path / "docs" / "leaderboard.md").exists()
    assert not (tmp_path / "merged" / "results.jsonl").exists()


def test_a_copy_of_a_row_fails_verify_and_merge_keeps_one(store, tmp_path, capsys):
    rows = stored_rows(store)
    copied = store_of([*rows, rows[_compacted(rows)]], tmp_path / "copied")
    code, err = _cli(capsys, "verify", copied)
    assert code == 2 and "a report would count it twice" in err, err
    assert merge_stores([copied], tmp_path / "merged")[:3] == (len(rows), 0, 0.0)


def test_a_method_of_two_codes_fails_merge_as_it_fails_verify(store, tmp_path, capsys):
    """Probe 64: a row whose method_code was edited was refused by verify and publish, while merge joined it (exit 0,
    "rows added") into a store that verify then refused. Merge checks each source as verify checks a store."""
    rows = stored_rows(store)
    at = _compacted(rows)
    rows[at] = {**rows[at], "method_code": "deadbeef0000"}
    bad = store_of(rows, tmp_path / "bad")
    for argv in (["verify", bad], ["merge", bad, "--out", tmp_path / "merged"]):
        code, err = _cli(capsys, *argv)
        assert code == 2 and "computed by two versions of its own code" in err and f":{at + 1}" in err, err
    assert not (tmp_path / "merged").exists()


def test_a_method_of_another_code_in_the_merged_store_is_refused_before_a_row(store, tmp_path):
    """A source whose method rows carry another code than the merged store's: the merged store would hold both."""
    merge_stores([store], tmp_path / "merged")
    before = (tmp_path / "merged" / "results.jsonl").read_bytes()
    other = store_of([{**row, "method_code": "deadbeef0000"} if row["press"] != "none" else row
                      for row in stored_rows(store)], tmp_path / "other")
    with pytest.raises(ValueError, match="computed by two versions of its own code"):
        merge_stores([other], tmp_path / "merged")
    assert (tmp_path / "merged" / "results.jsonl").read_bytes() == before


@pytest.mark.parametrize("change, message", [
    (lambda row: {"kept_entries": 1e9}, "kept_entries=1000000000.0 (expected an integer >= 0 at most body_entries"),
    (lambda row: {"kept_entries": row["body_entries"] + 1}, "at most body_entries"),
    (lambda row: {"protected": row["n_context"] + 1}, "protected="),
    (lambda row: {"n_context": -3}, "n_context=-3 (expected an integer >= 0 at most length = "),
])
def test_counts_beyond_the_context_fail_verify_and_merge(store, tmp_path, capsys, change, message):
    rows = stored_rows(store)
    at = _compacted(rows)
    rows[at] = {**rows[at], **change(rows[at])}
    bad = store_of(rows, tmp_path / "bad")
    for argv in (["verify", bad], ["merge", bad, "--out", tmp_path / "merged"]):
        code, err = _cli(capsys, *argv)
        assert code == 2 and f"{bad / 'results.jsonl'}:{at + 1}: " in err and message in err, err


def test_every_row_records_the_entries_its_press_chose_among(store):
    rows = stored_rows(store)
    kept = [row for row in rows if row["press"] != "none"]
    assert kept and all(0 < row["kept_entries"] <= row["body_entries"] for row in kept)
    # the tiny model: 2 attention layers of 2 KV heads; p = 0.5 keeps about half of each head's entries
    assert all(row["body_entries"] == 4 * (row["n_context"] - row["protected"]) for row in rows)
    assert all(abs(row["kept_entries"] - 0.5 * row["body_entries"]) <= 4 for row in kept)


@pytest.fixture
def published(store, tmp_path):
    docs = tmp_path / "docs"
    write_leaderboard([store], docs)
    return docs


def test_verify_passes_every_published_file(store, published):
    lines = []
    verify_stores([store], published, report=lines.append)
    assert lines[1:] == [f"{published / 'leaderboard.md'} is exactly what the store rebuilds",
                         f"{published / 'leaderboard.csv'} is exactly what the store rebuilds",
                         f"{published / 'leaderboard.html'} is exactly what the store rebuilds",
                         f"{published / 'leaderboard.png'}: the image(s) drawn with these tables "
                         f"({published / MANIFEST})"]


def _cut_png(docs):
    (docs / "leaderboard.png").write_bytes((docs / "leaderboard.png").read_bytes()[:500])


def _drop_two_csv_rows(docs):
    (docs / "leaderboard.csv").write_text("".join((docs / "leaderboard.csv").read_text().splitlines(True)[:-2]))


@pytest.mark.parametrize("damage, message", [
    (lambda docs: (docs / "leaderboard.png").unlink(), "leaderboard.png is missing"),
    (_cut_png, "leaderboard.png is not the image drawn with these tables"),
    (_drop_two_csv_rows, "leaderboard.csv is not what the store says"),
    (lambda docs: (docs / MANIFEST).unlink(), f"{MANIFEST} is missing"),
    (shutil.rmtree, "no such directory"),
])
def test_verify_refuses_a_damaged_published_file(store, published, capsys, damage, message):
    damage(published)
    code, err = _cli(capsys, "verify", store, "--docs", published)
    assert code == 2 and message in err, err
    if message == "no such directory":
        assert err.count("\n") == 1 and err.startswith("bench verify: error: --docs ")


def test_the_library_merge_as_the_command(store, tmp_path, monkeypatch):
    """Paths as text, no store at all, an out in the model cache: as ``bench merge`` takes or refuses them."""
    from pretrained import CACHE_ENV

    assert merge_stores([str(store)], str(tmp_path / "text")).added == len(stored_rows(store))
    with pytest.raises(ValueError, match="no store to merge"):
        merge_stores([], tmp_path / "none")
    for alone in (store, str(store)):  # one path, not a list: never read character by character
        with pytest.raises(ValueError, match=r"is one path: give a list of store directories"):
            merge_stores(alone, tmp_path / "none")
    with pytest.raises(ValueError, match=r"out '' is not a directory path \('' would mean the current folder\)"):
        merge_stores([store], "")
    with pytest.raises(ValueError, match=r"a source '' is not a directory path"):
        merge_stores([store, ""], tmp_path / "none")
    assert not (tmp_path / "none").exists()
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    for out in (tmp_path / "cache", tmp_path / "cache" / "models" / "x"):
        with pytest.raises(ValueError, match="the model cache's"):
            merge_stores([store], out)
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("field, value", [("batch", "0123456789abcdef"), ("needle_recall", 0.5),
                                          ("answer_recall", 0.5)])
def test_a_no_prune_row_holds_nothing_of_a_child(store, tmp_path, capsys, field, value):
    """The full cache answers alone, keeps every entry and is scored by no press: verify and merge refuse it."""
    rows = stored_rows(store)
    at = next(i for i, row in enumerate(rows) if row["press"] == "none")
    bad = store_of([{**row, field: value} if i == at else row for i, row in enumerate(rows)], tmp_path / "bad")
    for argv in (["verify", bad], ["merge", bad, "--out", tmp_path / "merged"]):
        code, err = _cli(capsys, *argv)
        assert code == 2 and f"{field}={value!r} in a no-prune row (expected none" in err, err
    assert not (tmp_path / "merged" / "results.jsonl").exists()


def test_verify_names_docs_that_hold_a_store(store, capsys):
    code, err = _cli(capsys, "verify", store, "--docs", store)
    assert code == 2 and f"--docs {store} holds a result store" in err and "not a published leaderboard" in err, err


@pytest.mark.parametrize("code, says", [
    (None, "the bench compare that wrote them stopped before finishing, or a later run into this store gave other "
           "methods or fractions: rerun one with the methods and fractions named (it resumes)"),
    ("0123456789ab", "its rows are of code 0123456789ab and this checkout's code is {here} (code that decides values "
                     "changed since), so a rerun here starts the run anew instead of finishing it"),
])
def test_an_unfinished_run_of_another_code_version_is_not_advised_a_rerun(store, tmp_path, capsys, code, says):
    """A rerun resumes only rows of this checkout's code version; rows of another would never be finished by it."""
    from bench.store.code_version import code_version

    rows = stored_rows(store)
    at = _compacted(rows)
    kept = [{**row, "code": code or row["code"]} for i, row in enumerate(rows) if i != at]
    stopped = store_of(kept, tmp_path / "stopped")
    exit_code, err = _cli(capsys, "verify", stopped)
    assert exit_code == 2 and "is incomplete" in err and says.format(here=code_version()) in err, err

"""A store holds every question of each context and one value of each kept fraction: every row records how many
questions its context has, so that ``bench verify`` and ``bench merge`` refuse a question missing for every method
or one the context does not have; and a kept fraction shown alike to a stored one of its method (0.3000001 and 0.3)
is refused by ``bench compare`` before any work, and by every reader of a store that holds both."""

import numpy as np
import pytest

import bench.run.plan
from bench.run.compare import run_compare
from bench.store.row_fields import BATCH, QUESTIONS, RUN
from runtime.errors import UsageError
from tests.helpers import assert_reports_refuse, compare_settings, run_cli, store_of, stored_rows

TASK = "niah_multikey_1"
"""A task whose contexts have several questions (one per needle key)."""
SETTINGS = dict(tasks=[TASK], keep_fractions=[0.3], length=400)


@pytest.fixture(scope="module", autouse=True)
def one_code_version():
    """Every run of this module under one code version: a resumed run must add rows to its own group, whatever
    other sources are edited meanwhile."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bench.run.plan, "code_version", lambda engine="hf": "c0dec0dec0de")
        yield


@pytest.fixture(scope="module")
def store(model_dir, tmp_path_factory):
    """No prune and keydiff/flat at p = 0.3 on one context of several questions."""
    out = tmp_path_factory.mktemp("run") / "store"
    run_compare(compare_settings(model_dir, out, **SETTINGS), show_progress=False)
    return out


def _without(rows: list[dict], questions: set[int]) -> list[dict]:
    return [row for row in rows if row["question"] not in questions]


def _refused_by_verify_and_merge(capsys, bad, tmp_path, *messages) -> None:
    for argv in (["verify", bad], ["merge", bad, "--out", tmp_path / "merged"]):
        code, err = run_cli(capsys, *argv)
        assert code == 2 and all(message in err for message in messages), err
    assert not (tmp_path / "merged").exists()


def test_every_row_records_how_many_questions_its_context_has(store):
    rows = stored_rows(store)
    count = rows[0][QUESTIONS]
    assert count > 1 and all(row[QUESTIONS] == count for row in rows)
    for method in {(row["press"], row["keep_fraction"]) for row in rows}:
        assert sorted(row["question"] for row in rows if (row["press"], row["keep_fraction"]) == method) == list(
            range(count))


@pytest.mark.parametrize("dropped", [{3}, {1, 2, 3}])
def test_a_question_missing_for_every_method_is_refused(store, tmp_path, capsys, dropped):
    bad = store_of(_without(stored_rows(store), dropped), tmp_path / "bad")
    _refused_by_verify_and_merge(capsys, bad, tmp_path, str(bad / "results.jsonl"), f"task {TASK}, item 0 lacks",
                                 f"none p=1 question {min(dropped)}", f"keydiff/flat p=0.3 question {min(dropped)}")


def test_a_question_the_context_does_not_have_is_refused(store, tmp_path, capsys):
    rows = stored_rows(store)
    renamed = [{**row, "question": 99} if row["question"] == 1 else row for row in rows]
    line = next(number for number, row in enumerate(renamed, start=1) if row["question"] == 99)
    bad = store_of(renamed, tmp_path / "bad")
    _refused_by_verify_and_merge(capsys, bad, tmp_path, f"holds question 99 of task {TASK}, item 0 at "
                                 f"{bad / 'results.jsonl'}:{line}, which has {rows[0][QUESTIONS]} question(s)")


def test_compare_resumes_a_question_missing_for_every_method(store, model_dir, tmp_path, capsys):
    rows = stored_rows(store)
    kept = _without(rows, {3})
    resumed = store_of(kept, tmp_path / "resumed")
    run_compare(compare_settings(model_dir, resumed, **SETTINGS), show_progress=False)
    added = stored_rows(resumed)[len(kept):]
    assert sorted((row["press"], row["question"]) for row in added) == sorted(
        (row["press"], row["question"]) for row in rows if row["question"] == 3)
    assert run_cli(capsys, "verify", resumed)[0] == 0


def test_rows_written_before_the_count_are_checked_as_before(store, tmp_path, capsys):
    """Committed stores name neither their run nor their contexts' question counts (nor their batch, recorded
    since): a whole one still verifies, and a question one method lacks is still named."""
    legacy = [{k: v for k, v in row.items() if k not in (QUESTIONS, RUN, BATCH)} for row in stored_rows(store)]
    code, err = run_cli(capsys, "verify", store_of(legacy, tmp_path / "legacy"))
    assert code == 0, err
    lacking = [row for row in legacy if not (row["press"] == "keydiff" and row["question"] == 2)]
    code, err = run_cli(capsys, "verify", store_of(lacking, tmp_path / "lacking"))
    assert code == 2 and "lacks the rows of keydiff/flat p=0.3 question 2" in err, err


def test_compare_refuses_a_fraction_shown_like_a_stored_one(store, model_dir, tmp_path, capsys, no_model_load):
    again = store_of(stored_rows(store), tmp_path / "again")
    before = (again / "results.jsonl").read_bytes()
    code, err = run_cli(capsys, "compare", "--model", model_dir, "--press", "keydiff,none", "--alloc", "flat",
                        "--keep-fractions", "0.3000001", "--tasks", TASK, "--n", "1", "--length", "400",
                        "--out", again)
    assert code == 2 and "kept fraction 0.3000001" in err and "holds its rows at 0.3" in err, err
    assert "give 0.3 to resume them" in err
    assert (again / "results.jsonl").read_bytes() == before


def test_the_library_refuses_a_float32_fraction_then_its_float64_twin(model_dir, tmp_path):
    out = tmp_path / "out"
    run_compare(compare_settings(model_dir, out, **{**SETTINGS, "keep_fractions": [np.float32(0.3)]}),
                show_progress=False)
    before = (out / "results.jsonl").read_bytes()
    with pytest.raises(UsageError, match=r"kept fraction 0\.3 .*holds its rows at 0\.30000001192092896"):
        run_compare(compare_settings(model_dir, out, **SETTINGS), show_progress=False)
    assert (out / "results.jsonl").read_bytes() == before


def _twin(rows: list[dict]) -> list[dict]:
    """``rows``' compacted rows at 0.3000001 instead of 0.3."""
    return [{**row, "keep_fraction": 0.3000001} for row in rows if row["press"] != "none"]


def test_readers_refuse_a_store_holding_a_fraction_under_two_values(store, tmp_path, capsys):
    rows = stored_rows(store)
    bad = store_of([*rows, *_twin(rows)], tmp_path / "bad")
    message = "hold keydiff/flat at kept fractions 0.3 and 0.3000001, one fraction where reports show them (p=0.3)"
    assert_reports_refuse(capsys, bad, tmp_path / "docs", message)
    _refused_by_verify_and_merge(capsys, bad, tmp_path, message)


def test_readers_refuse_two_stores_holding_one_fraction_under_two_values(store, tmp_path, capsys):
    rows = stored_rows(store)
    other = store_of([*(row for row in rows if row["press"] == "none"), *_twin(rows)], tmp_path / "other")
    message = "hold keydiff/flat at kept fractions 0.3 and 0.3000001, one fraction where reports show them"
    code, err = run_cli(capsys, "verify", store, other)
    assert code == 2 and f"{store / 'results.jsonl'}:" in err and f"{other / 'results.jsonl'}:" in err, err
    assert message in err
    code, err = run_cli(capsys, "merge", store, other, "--out", tmp_path / "merged")
    assert code == 2 and message in err, err
    assert not (tmp_path / "merged").exists()

"""``bench verify`` refuses a row whose values no run could have written — a negative NLL, byte count or time, a
count or key field of the wrong type, a ΔNLL that is not the row's NLL minus the no-prune row's — naming its file,
line, field and what is allowed; a real run's rows pass, and rows written before a field existed still do."""


import pytest

from bench.compare import run_compare
from bench.row_checks import DELTA_NLL_TOLERANCE
from tests.helpers import assert_reports_refuse, compare_settings, run_cli, store_of, stored_rows

QUESTION_FIELDS = ("task", "item", "question", "haystack")
"""What names one question of one context within a run's rows."""


@pytest.fixture(scope="module")
def run(model_dir, tmp_path_factory):
    """A finished run of the tiny model: no prune and keydiff/flat at p = 0.5 on two contexts."""
    out = tmp_path_factory.mktemp("run")
    run_compare(compare_settings(model_dir, out, n=2), show_progress=False)
    return out




def _baseline_of(rows, row) -> dict:
    """The no-prune row of ``row``'s question."""
    return next(other for other in rows if other["press"] == "none"
                and all(other[field] == row[field] for field in QUESTION_FIELDS))


@pytest.mark.parametrize("press", ["keydiff", "none"])
@pytest.mark.parametrize("change, message", [
    ({"answer_nll": -0.5}, "answer_nll=-0.5 (expected a finite number >= 0)"),
    ({"kl": -0.001}, "kl=-0.001 (expected a finite number >= 0)"),
    ({"kv_bytes": -1}, "kv_bytes=-1 (expected an integer >= 0)"),
    ({"kv_bytes": 1.5}, "kv_bytes=1.5 (expected an integer >= 0)"),
    ({"kv_bytes": "4096"}, "kv_bytes='4096' (expected an integer >= 0)"),
    ({"recurrent_bytes": -8}, "recurrent_bytes=-8 (expected an integer >= 0)"),
    ({"recurrent_bytes": 2.0}, "recurrent_bytes=2.0 (expected an integer >= 0)"),
    ({"prefill_seconds": -0.25}, "prefill_seconds=-0.25 (expected a finite number >= 0)"),
    ({"prefill_seconds": float("inf")}, "prefill_seconds=inf (expected a finite number >= 0)"),
    ({"prefill_seconds": "0.1"}, "prefill_seconds='0.1' (expected a finite number >= 0)"),
    ({"score_seconds": float("nan")}, "score_seconds=nan (expected a finite number >= 0)"),
    ({"length": "512"}, "length='512' (expected an integer >= 1)"),
    ({"length": 0}, "length=0 (expected an integer >= 1)"),
    ({"length": 300.0}, "length=300.0 (expected an integer >= 1)"),
    ({"item": -1}, "item=-1 (expected an integer >= 0)"),
    ({"item": "0"}, "item='0' (expected an integer >= 0)"),
    ({"question": "0"}, "question='0' (expected an integer >= 0)"),
    ({"question": -1}, "question=-1 (expected an integer >= 0)"),
    ({"question": True}, "question=True (expected an integer >= 0)"),
    ({"seed": "0"}, "seed='0' (expected an integer)"),
    ({"seed": 0.5}, "seed=0.5 (expected an integer)"),
])
def test_a_value_no_run_writes_is_named_by_its_line(run, tmp_path, capsys, press, change, message):
    """Each value altered by hand in one row, of a compacted child or of the full cache, is named with its line and
    what is allowed — a question given as text too, which a rerun would never write (not an incomplete run)."""
    rows = stored_rows(run)
    at = next(i for i, row in enumerate(rows) if row["press"] == press)
    rows[at] = {**rows[at], **change}
    bad = store_of(rows, tmp_path / "bad")
    assert_reports_refuse(capsys, bad, tmp_path / "docs", f"{bad / 'results.jsonl'}:{at + 1}: {message}")


def test_every_delta_nll_of_a_run_is_its_nll_minus_the_full_cache_nll(run, capsys):
    """The invariant the cross-row check holds rows to: a child's ΔNLL is the float64 difference of its NLL and
    the full cache's (the no-prune row's), so every row a run writes meets it exactly, far within the tolerance."""
    rows = stored_rows(run)
    children = [row for row in rows if row["press"] != "none"]
    assert children and all(row["delta_nll"] == row["answer_nll"] - _baseline_of(rows, row)["answer_nll"]
                            for row in children)
    code, err = run_cli(capsys, "verify", run)
    assert code == 0, err


@pytest.mark.parametrize("alter", ["delta_nll", "baseline answer_nll", "answer_nll"])
def test_a_delta_nll_that_is_not_the_difference_is_named(run, tmp_path, capsys, alter):
    """A ΔNLL altered by hand (or either NLL it is the difference of) by more than float rounding: the child's
    line is named with the difference it must equal, the no-prune row's line and the tolerance."""
    rows = stored_rows(run)
    at = next(i for i, row in enumerate(rows) if row["press"] != "none")
    baseline = next(i for i, row in enumerate(rows) if row is _baseline_of(rows, rows[at]))
    shift = 1e3 * DELTA_NLL_TOLERANCE * max(1.0, rows[at]["answer_nll"], rows[baseline]["answer_nll"])
    if alter == "delta_nll":
        rows[at]["delta_nll"] += shift
    elif alter == "answer_nll":
        rows[at]["answer_nll"] += shift
    else:
        rows[baseline]["answer_nll"] += shift
    nll, full = rows[at]["answer_nll"], rows[baseline]["answer_nll"]
    bad = store_of(rows, tmp_path / "bad")
    code, err = run_cli(capsys, "verify", bad)
    path = bad / "results.jsonl"
    assert code == 2 and "1 row(s) are not valid results" in err, err
    assert (f"{path}:{at + 1}: delta_nll={rows[at]['delta_nll']!r} (expected answer_nll {nll!r} minus the no-prune "
            f"row's answer_nll {full!r} ({path}:{baseline + 1}) = {nll - full!r}, within "
            f"{DELTA_NLL_TOLERANCE * max(1.0, abs(nll), abs(full)):.3g})") in err, err


def test_a_delta_nll_off_by_float_rounding_passes(run, tmp_path, capsys):
    """Every full-cache NLL moved by a tenth of the tolerance (its float32 sum rounded otherwise): the children's
    ΔNLL still passes."""
    rows = stored_rows(run)
    for row in rows:
        if row["press"] == "none":
            row["answer_nll"] *= 1 + DELTA_NLL_TOLERANCE / 10
    code, err = run_cli(capsys, "verify", store_of(rows, tmp_path / "rounded"))
    assert code == 0, err


def test_children_without_a_no_prune_row_are_not_held_to_one(run, tmp_path, capsys):
    """A run of compacted children alone (no ``none`` press) has no full-cache row to compare with."""
    rows = [row for row in stored_rows(run) if row["press"] != "none"]
    code, err = run_cli(capsys, "verify", store_of(rows, tmp_path / "children"))
    assert code == 0, err


def test_rows_written_before_sizes_and_timings_were_recorded_still_pass(run, tmp_path, capsys):
    """The byte counts and timings are checked where a row holds them: rows written before them lack them."""
    later = ("kv_bytes", "recurrent_bytes", "prefill_seconds", "score_seconds")
    rows = [{field: value for field, value in row.items() if field not in later} for row in stored_rows(run)]
    code, err = run_cli(capsys, "verify", store_of(rows, tmp_path / "older"))
    assert code == 0, err

"""``bench verify`` refuses a row whose values no run could have written — a negative NLL, byte count or time, a
count or key field of the wrong type, a setting no run has, a score that is not its prediction's, more kept entries
than the allocator's budget, a ΔNLL that is not the row's NLL minus the no-prune row's — naming its file, line,
field and what is allowed; a real run's rows pass, and rows written before a field existed still do."""

import json
import reprlib

import pytest

from allocators.integerize import round_half_up
from bench.run.compare import run_compare
from bench.store.row_fields import SCHEMA
from bench.store.row_set_checks import DELTA_NLL_TOLERANCE
from pretrained.loading import fingerprint_of_parts
from tests.helpers import assert_reports_refuse, compare_settings, run_cli, store_of, stored_rows
from workloads.metrics import string_match_all

NLL_RANGE = "a finite number in [0, 1e+06] nats: a sum of a language model's log-probabilities)"
KL_RANGE = ("a finite number in [-1e-06, 1e+06] nats: a mean KL divergence of two distributions (below 0 by rounding "
            "only))")
"""How a refusal names the range of an NLL and a KL."""
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
    ({"answer_nll": -0.5}, "answer_nll=-0.5 (expected " + NLL_RANGE),
    ({"kl": -0.001}, "kl=-0.001 (expected " + KL_RANGE),
    ({"answer_nll": 1e308, "delta_nll": 1e308}, "answer_nll=1e+308 (expected " + NLL_RANGE),
    ({"answer_nll": float("nan")}, "answer_nll=nan (expected " + NLL_RANGE),
    # probe 12: an integer past float's range raised OverflowError in the range check
    ({"answer_nll": 10 ** 400}, f"answer_nll={reprlib.repr(10 ** 400)} (expected " + NLL_RANGE),
    ({"kl": -10 ** 400}, f"kl={reprlib.repr(-10 ** 400)} (expected " + KL_RANGE),
    ({"keep_fraction": 10 ** 400}, f"keep_fraction={reprlib.repr(10 ** 400)} (expected a number in (0, 1])"),
    ({"prefill_seconds": 10 ** 400}, f"prefill_seconds={reprlib.repr(10 ** 400)} (expected a finite number of "
                                     "seconds in [0, 1e+09])"),
    ({"kl": float("inf")}, "kl=inf (expected " + KL_RANGE),
    ({"kl": 1e300}, "kl=1e+300 (expected " + KL_RANGE),
    ({"delta_nll": -float("inf")}, "delta_nll=-inf (expected a finite number in [-1e+06, 1e+06] nats: a "
                                     "difference of two NLLs)"),
    ({"delta_nll": 1e300}, "delta_nll=1e+300 (expected a finite number in [-1e+06, 1e+06]"),
    # the re-probe of 64: 3e38, finite in float32, passed verify and printed as a 39-digit mean
    ({"answer_nll": 3.0e38, "delta_nll": 3.0e38}, "answer_nll=3e+38 (expected " + NLL_RANGE),
    ({"needle_recall": 1.5}, "needle_recall=1.5 (expected a number in [0, 1])"),
    ({"answer_recall": float("nan")}, "answer_recall=nan (expected a number in [0, 1])"),
    ({"prefill_seconds": 1e300}, "prefill_seconds=1e+300 (expected a finite number of seconds in [0, 1e+09])"),
    ({"kv_bytes": -1}, "kv_bytes=-1 (expected an integer >= 0)"),
    ({"kv_bytes": 1.5}, "kv_bytes=1.5 (expected an integer >= 0)"),
    ({"kv_bytes": "4096"}, "kv_bytes='4096' (expected an integer >= 0)"),
    ({"recurrent_bytes": -8}, "recurrent_bytes=-8 (expected an integer >= 0)"),
    ({"recurrent_bytes": 2.0}, "recurrent_bytes=2.0 (expected an integer >= 0)"),
    ({"prefill_seconds": -0.25}, "prefill_seconds=-0.25 (expected a finite number of seconds in [0, 1e+09])"),
    ({"prefill_seconds": float("inf")}, "prefill_seconds=inf (expected a finite number of seconds in [0, 1e+09])"),
    ({"prefill_seconds": "0.1"}, "prefill_seconds='0.1' (expected a finite number of seconds in [0, 1e+09])"),
    ({"score_seconds": float("nan")}, "score_seconds=nan (expected a finite number of seconds in [0, 1e+09])"),
    ({"length": "512"}, "length='512' (expected an integer >= 1)"),
    ({"length": 0}, "length=0 (expected an integer >= 1)"),
    ({"length": 300.0}, "length=300.0 (expected an integer >= 1)"),
    ({"item": -1}, "item=-1 (expected an integer >= 0)"),
    ({"item": "0"}, "item='0' (expected an integer >= 0)"),
    ({"question": "0"}, "question='0' (expected an integer >= 0)"),
    ({"question": -1}, "question=-1 (expected an integer >= 0)"),
    ({"question": True}, "question=True (expected an integer >= 0)"),
    ({"seed": "0"}, "seed='0' (expected an integer >= 0)"),
    ({"seed": 0.5}, "seed=0.5 (expected an integer >= 0)"),
    ({"seed": -1}, "seed=-1 (expected an integer >= 0)"),
    ({"press": 3}, "press=3 (expected text)"),
    ({"allocator": ["flat"]}, "allocator=['flat'] (expected text)"),
    ({"task": 3}, "task=3 (expected text)"),
    ({"model": {"name": "tiny"}}, "model={'name': 'tiny'} (expected text)"),
    ({"weights": 5}, "weights=5 (expected text)"),
    ({"task": "foo_task"}, "task='foo_task' (expected one of niah_single_1, "),
    ({"profile": "zzz"}, "profile='zzz' (expected one of faithful, compact)"),
    ({"engine": "trt"}, "engine='trt' (expected one of hf, vllm)"),
    ({"schema": SCHEMA + 7}, f"schema={SCHEMA + 7} (expected an integer in 1 … {SCHEMA}: this version writes "),
    ({"schema": str(SCHEMA)}, f"schema='{SCHEMA}' (expected an integer in 1 … {SCHEMA}"),
    ({"prediction": 5}, "prediction=5 (expected text)"),
    ({"answers": "8379"}, "answers='8379' (expected a non-empty list of text)"),
    ({"answers": []}, "answers=[] (expected a non-empty list of text)"),
    ({"answers": [8379]}, "answers=[8379] (expected a non-empty list of text)"),
    ({"prediction": "", "score": 1.0}, "score=1.0 (expected 0.0: string_match_all of its prediction '' and answers"),
    ({"n_context": 100000}, "n_context=100000 (expected an integer >= 0 at most length = 300)"),
])
def test_a_value_no_run_writes_is_named_by_its_line(run, tmp_path, capsys, press, change, message):
    """Each value altered by hand in one row, of a compacted child or of the full cache, is named with its line and
    what is allowed — a question given as text too, which a rerun would never write (not an incomplete run)."""
    rows = stored_rows(run)
    at = next(i for i, row in enumerate(rows) if row["press"] == press)
    rows[at] = {**rows[at], **change}
    bad = store_of(rows, tmp_path / "bad")
    assert_reports_refuse(capsys, bad, tmp_path / "docs", f"{bad / 'results.jsonl'}:{at + 1}: {message}")


@pytest.mark.parametrize("press, change, message", [
    ("none", {"keep_fraction": 0.5}, "keep_fraction=0.5 (expected 1 in a no-prune row: the full cache keeps every "),
    ("none", {"allocator": "flat"}, "press='none' with allocator='flat' (expected both 'none', no prune, or neither"),
    ("keydiff", {"allocator": "none"}, "press='keydiff' with allocator='none' (expected both 'none', no prune, or "),
])
def test_a_no_prune_row_is_the_full_cache_alone(run, tmp_path, capsys, press, change, message):
    """No prune keeps every entry (p = 1) with no allocator, and a press always has one: a no-prune row at another
    fraction, or press and allocator of which one alone is ``none``, is no setting a rerun writes (not incomplete)."""
    rows = stored_rows(run)
    at = next(i for i, row in enumerate(rows) if row["press"] == press)
    rows[at] = {**rows[at], **change}
    bad = store_of(rows, tmp_path / "bad")
    assert_reports_refuse(capsys, bad, tmp_path / "docs", f"{bad / 'results.jsonl'}:{at + 1}: {message}")


def test_a_key_that_cannot_be_hashed_is_named_by_merge_too(run, tmp_path, capsys):
    """A list where text belongs is named by ``bench merge`` as by verify (never a raw ``TypeError``), and nothing
    is merged."""
    rows = stored_rows(run)
    rows[0]["allocator"] = ["none"]
    bad = store_of(rows, tmp_path / "bad")
    code, err = run_cli(capsys, "merge", bad, "--out", tmp_path / "merged")
    assert code == 2 and f"{bad / 'results.jsonl'}:1: allocator=['none'] (expected text)" in err, err
    assert not (tmp_path / "merged").exists()


@pytest.mark.parametrize("kept", ["every body entry", "one more per head", "one fewer"])
def test_kept_entries_other_than_the_allocators_budget_are_named(run, tmp_path, capsys, kept):
    """A child keeps exactly heads · round(p · (n_context − protected)) entries (the allocator's budget): more, or
    fewer, is named with that budget."""
    rows = stored_rows(run)
    at = next(i for i, row in enumerate(rows) if row["press"] != "none")
    row = rows[at]
    heads = row["body_entries"] // (row["n_context"] - row["protected"])
    budget = row["kept_entries"]
    row["kept_entries"] = {"every body entry": row["body_entries"], "one more per head": budget + heads,
                           "one fewer": budget - 1}[kept]
    bad = store_of(rows, tmp_path / "bad")
    assert_reports_refuse(capsys, bad, tmp_path / "docs",
                          f"{bad / 'results.jsonl'}:{at + 1}: kept_entries={row['kept_entries']} (expected {budget}: ")


@pytest.mark.parametrize("change", ["kv_bytes", "agree", "agree without a prediction"])
def test_a_child_is_held_to_its_full_cache_row(run, tmp_path, capsys, change):
    """A child that holds more attention cache than the full cache, or that agrees with the full cache's greedy
    answer while its prediction differs (the same tokens decode to the same text) or is missing (a row written
    before rows held their run, where a prediction was optional), is named with the no-prune row's line."""
    rows = stored_rows(run)
    at = next(i for i, row in enumerate(rows) if row["press"] != "none")
    full = next(i for i, row in enumerate(rows) if row is _baseline_of(rows, rows[at]))
    path = tmp_path / "bad" / "results.jsonl"
    if change == "kv_bytes":
        rows[at]["kv_bytes"] = rows[full]["kv_bytes"] + 1
        message = (f"kv_bytes={rows[at]['kv_bytes']} (expected at most the no-prune row's {rows[full]['kv_bytes']} "
                   f"({path}:{full + 1})")
    elif change == "agree without a prediction":
        for field in ("prediction", "run", "questions", "batch"):
            rows[at].pop(field, None)
        rows[at]["agree"] = True
        message = (f"agree=True with prediction None, not the no-prune row's "
                   f"{reprlib.repr(rows[full]['prediction'])} ({path}:{full + 1}) (expected false")
    else:
        rows[at].update(prediction="zz", agree=True, score=0.0)
        message = (f"agree=True with prediction 'zz', not the no-prune row's {reprlib.repr(rows[full]['prediction'])} "
                   f"({path}:{full + 1}) (expected false")
    bad = store_of(rows, tmp_path / "bad")
    assert_reports_refuse(capsys, bad, tmp_path / "docs", f"{path}:{at + 1}: {message}")


def test_every_row_of_a_run_meets_the_checks_of_sizes_score_and_agreement(run):
    """The invariants the checks hold rows to, on a real run: each context within its length, each child's kept
    entries its allocator's exact budget and its attention cache within the full cache's, each score RULER's
    string_match_all of its prediction, and a child that agrees with the full cache's answer predicting its text."""
    rows = stored_rows(run)
    children = [row for row in rows if row["press"] != "none"]
    assert children and all(row["n_context"] <= row["length"] for row in rows)
    assert all(row["score"] == string_match_all(row["prediction"], row["answers"]) for row in rows)
    for row in children:
        full, body = _baseline_of(rows, row), row["n_context"] - row["protected"]
        assert row["kept_entries"] == row["body_entries"] // body * round_half_up(row["keep_fraction"] * body)
        assert row["kv_bytes"] <= full["kv_bytes"]
        assert not row["agree"] or row["prediction"] == full["prediction"]


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


ONE_MODEL, ONE_CONTEXT = "run one model", "answer one context, fitted to one length"
"""Why a child and its no-prune row hold one model, and one length."""


@pytest.mark.parametrize("field, edited, one", [("model", "keydiff", ONE_MODEL), ("weights", "keydiff", ONE_MODEL),
                                                ("length", "keydiff", ONE_CONTEXT), ("length", "none", ONE_CONTEXT)])
def test_a_child_apart_from_its_no_prune_row_is_named(run, tmp_path, capsys, field, edited, one):
    """Probe 8, item 6: a child renamed smollm2-135m-instruct (or given other weights) beside the hybrid's no-prune
    row passed verify, and the leaderboard made a section of it, its ΔNLL the hybrid's. Probe 12: a no-prune row's
    length edited made a group of no prune alone at a length that never ran. A child's ΔNLL is the difference with
    that row's NLL, so the pair is named with both values and that row's line, whichever of the two was edited."""
    rows = stored_rows(run)
    child = next(i for i, row in enumerate(rows) if row["press"] != "none")
    full = next(i for i, row in enumerate(rows) if row is _baseline_of(rows, rows[child]))
    edit = rows[full if edited == "none" else child]
    if field == "model":
        edit["model"] = "smollm2-135m-instruct"
    elif field == "weights":  # other weights, their fingerprint as a run would write it
        edit["model_parts"]["weights"] = "0" * 12
        edit["weights"] = fingerprint_of_parts(edit["model_parts"])
    else:
        edit["length"] += 16  # one its context fits (a far one is refused as a row: test_context_fit.py)
    bad = store_of(rows, tmp_path / "bad")
    path = bad / "results.jsonl"
    assert_reports_refuse(capsys, bad, tmp_path / "docs",
                          f"{path}:{child + 1}: {field}={rows[child][field]!r}, where the no-prune row its delta_nll "
                          f"was measured against ({path}:{full + 1}) holds {rows[full][field]!r} (expected the same: "
                          f"a child and its full cache {one})")


def test_children_of_another_model_alone_beside_a_no_prune_row_pass(run, tmp_path, capsys):
    """Another model's children alone (their no-prune rows in another store) beside this model's: their ΔNLL was
    measured against their own full cache, not against these rows, so they are not held to them."""
    rows = stored_rows(run)
    fulls = [dict(row, model="other", answer_nll=row["answer_nll"] + 1.0) for row in rows if row["press"] == "none"]
    for row in rows:
        if row["press"] != "none":
            row.update(model="other", answer_nll=row["answer_nll"] + 1.0)
    code, err = run_cli(capsys, "verify", store_of(rows, tmp_path / "two-models"), store_of(fulls, tmp_path / "fulls"))
    assert code == 0, err


def test_rows_written_before_sizes_and_timings_were_recorded_still_pass(run, tmp_path, capsys):
    """The byte counts and timings are checked where a row holds them: rows written before them lack them."""
    later = ("kv_bytes", "recurrent_bytes", "prefill_seconds", "score_seconds")
    rows = [{field: value for field, value in row.items() if field not in later} for row in stored_rows(run)]
    code, err = run_cli(capsys, "verify", store_of(rows, tmp_path / "older"))
    assert code == 0, err


@pytest.mark.parametrize("alter, message", [
    ("layer named x", "needle_recall_layers has the layer 'x' (expected an attention layer's index, e.g. '7')"),
    ("no layers", "needle_recall_layers={} (expected {layer: [a number in [0, 1] per head]}, not empty)"),
    ("no heads", "(expected {layer: [a number in [0, 1] per head]}, not empty)"),
    ("a head fewer", "answer_recall_layers holds layers and heads {"),
    ("recall not the mean", "needle_recall=0.123 (expected the mean of needle_recall_layers over every layer and "
                            "head, "),
    ("other answers", "answers=['not the answer'] (expected the no-prune row's "),
    ("per-layer null", "needle_recall, answer_recall, answer_recall_layers without needle_recall_layers (expected "
                       "all of needle_recall, needle_recall_layers, answer_recall, answer_recall_layers in a child"),
    ("recall missing", "needle_recall_layers, answer_recall, answer_recall_layers without needle_recall"),
    ("no needle fields", "no needle recall (needle_recall_layers, answer_recall_layers, answer_rank_layers), where "
                         "the child at "),
    ("other layers everywhere", "needle_recall_layers holds layers and heads {"),
])
def test_per_layer_values_of_a_child_are_one_shape_and_its_recalls_their_means(run, tmp_path, capsys, alter, message):
    """A child's per-layer fields hold one value per attention layer (named by its index) and KV head, the same
    layers and heads in each; its recalls are their means; its answers its question's, as the no-prune row's."""
    rows = stored_rows(run)
    at = next(i for i, row in enumerate(rows) if row["press"] != "none" and row.get("needle_recall_layers"))
    row = rows[at]
    layer = next(iter(row["needle_recall_layers"]))
    if alter == "layer named x":
        row["needle_recall_layers"]["x"] = row["needle_recall_layers"].pop(layer)
    elif alter == "no layers":
        row["needle_recall_layers"] = {}
    elif alter == "no heads":
        row["needle_recall_layers"][layer] = []
        message = f"needle_recall_layers={reprlib.repr(row['needle_recall_layers'])} {message}"
    elif alter == "a head fewer":
        row["answer_recall_layers"][layer] = row["answer_recall_layers"][layer][:-1]
    elif alter == "recall not the mean":
        row["needle_recall"] = 0.123
    elif alter == "per-layer null":
        row["needle_recall_layers"] = None
    elif alter == "recall missing":
        del row["needle_recall"]
    elif alter in ("no needle fields", "other layers everywhere"):  # a second child of the question, then altered
        row = json.loads(json.dumps({**row, "press": "snapkv"}))
        rows.insert(at + 1, row)
        at += 1
        if alter == "no needle fields":
            for field in ("needle_recall", "needle_recall_layers", "answer_recall", "answer_recall_layers",
                          "answer_rank_layers"):
                del row[field]
        else:
            for field in ("needle_recall_layers", "answer_recall_layers", "answer_rank_layers"):
                row[field] = {"99" if key == layer else key: heads for key, heads in row[field].items()}
    else:
        row["answers"] = ["not the answer"]
        row["score"] = string_match_all(row["prediction"], row["answers"])
    bad = store_of(rows, tmp_path / "bad")
    assert_reports_refuse(capsys, bad, tmp_path / "docs", f"{bad / 'results.jsonl'}:{at + 1}: {message}")

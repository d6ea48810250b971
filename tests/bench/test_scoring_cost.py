"""The leaderboard's cost table: each press's scoring time over its context's prefill, counted once a context."""

import re

from bench.reports.scoring_cost import scoring_cost_markdown, scoring_rows


def _rows(press, task, item, prefill, score, fractions=(0.1, 0.5), allocators=("flat", "global")):
    base = {"task": task, "haystack": "manpages", "seed": 0, "item": item, "prefill_seconds": prefill}
    out = [{**base, "press": "none", "allocator": "none", "keep_fraction": 1.0}]
    for alloc in allocators:
        out += [{**base, "press": press, "allocator": alloc, "keep_fraction": p, "score_seconds": score}
                for p in fractions]
    return out


def _cells(lines):
    return {line.split(" | ")[0].strip("| "): [float(x) for x in re.findall(r"-?\d+\.\d+", line.split(" | ")[2])]
            for line in lines if line.startswith("| ") and not line.startswith("| press")}


def test_a_press_counts_once_a_context_whatever_its_allocators_and_fractions():
    rows = _rows("kvzip", "a", 0, 2.0, 1.0) + _rows("kvzip", "a", 1, 1.0, 2.0, allocators=("global",))
    per_context = scoring_rows(rows)
    assert sorted(r["scoring_share"] for r in per_context) == [0.5, 2.0]


def test_the_share_is_the_mean_over_tasks_of_the_mean_over_contexts():
    # task a: shares 0.5 and 0.1 (mean 0.3); task b: 0.02 (mean 0.02) -> 0.16 over the tasks, each weighing one
    rows = (_rows("gatesight", "a", 0, 2.0, 1.0) + _rows("gatesight", "a", 1, 10.0, 1.0)
            + _rows("gatesight", "b", 0, 50.0, 1.0))
    cells = _cells(scoring_cost_markdown(rows, resamples=200))
    mean, low, high = cells["gatesight"]
    assert abs(mean - 16.0) < 1e-9 and low <= mean <= high


def test_only_the_tasks_every_press_scored_enter_the_table():
    rows = _rows("gatesight", "a", 0, 2.0, 1.0) + _rows("snapkv", "a", 0, 2.0, 0.2) + _rows("snapkv", "b", 0, 1.0, 1.0)
    text = "\n".join(scoring_cost_markdown(rows, resamples=50))
    assert "averaged over 1 task(s)" in text
    assert _cells(text.splitlines())["snapkv"][0] == 10.0


def test_rows_without_times_give_no_table():
    rows = [{k: v for k, v in row.items() if k != "score_seconds"} for row in _rows("keydiff", "a", 0, 1.0, 0.1)]
    assert scoring_cost_markdown(rows) == []
    assert scoring_cost_markdown(_rows("keydiff", "a", 0, 0.0, 0.1)) == []


def test_presses_are_averaged_over_the_same_contexts_and_n_says_how_many():
    """Probe 62: a press timed on one context of two was averaged over it alone, the others over both, under a
    header saying n ≥ 2. Like for like: the contexts every press was timed on, counted per task."""
    rows = _rows("gatesight", "a", 0, 2.0, 1.0) + _rows("gatesight", "a", 1, 10.0, 1.0) + _rows("snapkv", "a", 0,
                                                                                                 2.0, 0.2)
    rows += [{k: v for k, v in row.items() if k != "score_seconds"} for row in _rows("snapkv", "a", 1, 10.0, 9.0)]
    text = "\n".join(scoring_cost_markdown(rows, resamples=50))
    assert "on the contexts every press below was timed on (n = 1 context a task)" in text, text
    assert _cells(text.splitlines())["gatesight"][0] == 50.0 and _cells(text.splitlines())["snapkv"][0] == 10.0


def test_a_press_without_times_is_named_and_bad_times_are_not_counted():
    untimed = [{k: v for k, v in row.items() if k != "score_seconds"} for row in _rows("tova", "a", 0, 2.0, 0.1)]
    bad = [{**row, "prefill_seconds": value} for value, row in zip(
        (float("nan"), -1.0, "2.0", True), _rows("keydiff", "a", 0, 2.0, 0.1, allocators=("flat", "global", "x")))]
    text = "\n".join(scoring_cost_markdown(_rows("gatesight", "a", 0, 2.0, 1.0) + untimed + bad, resamples=50))
    assert "Not timed (rows without both times, or a prefill recorded as 0): keydiff, tova." in text, text
    assert set(_cells(text.splitlines())) == {"gatesight"}


def test_tasks_of_other_counts_are_each_counted():
    rows = _rows("gatesight", "a", 0, 2.0, 1.0) + _rows("gatesight", "b", 0, 2.0, 1.0) + _rows("gatesight", "b", 1,
                                                                                                 2.0, 1.0)
    text = "\n".join(scoring_cost_markdown(rows, resamples=50))
    assert "(n = contexts a task: a@manpages 1, b@manpages 2)" in text, text


def test_runs_merged_on_one_context_count_each_measurement_over_its_own_prefill():
    """Probe 63: the first row's times stood for the press on that context, whichever run wrote it."""
    rows = _rows("keydiff", "a", 0, 2.0, 1.0, fractions=(0.5,)) + _rows("keydiff", "a", 0, 4.0, 4.0, fractions=(0.2,))
    [row] = scoring_rows(rows)
    assert row["scoring_share"] == (0.5 + 1.0) / 2 and row["score_seconds"] == 2.5


def test_presses_timed_on_no_common_context_are_said_to_be():
    rows = _rows("keydiff", "a", 0, 2.0, 1.0) + _rows("snapkv", "a", 1, 2.0, 1.0)
    text = "\n".join(scoring_cost_markdown(rows, resamples=50))
    assert "No context was timed with every press (keydiff, snapkv)" in text

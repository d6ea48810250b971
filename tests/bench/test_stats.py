"""Paired bootstrap and the reports built on it: exact on constructed data, groups never averaged together."""

import re

import numpy as np
import pytest

from bench.reports.report import GroupReport, plot_curves, summary_markdown
from bench.reports.stats import PairedBootstrap

GROUP = {"model": "m", "weights": "w", "profile": "compact", "length": 512, "code": "c"}


def _rows(values: dict[tuple[str, str, float], list[float]], task="t", field="score", **extra):
    rows = []
    for (press, alloc, ratio), per_item in values.items():
        for item, v in enumerate(per_item):
            rows.append({**GROUP, **extra, "press": press, "allocator": alloc, "keep_fraction": ratio, "task": task,
                         "item": item, "question": 0, field: v})
    return rows


def test_paired_difference_of_a_constant_shift_has_zero_width():
    rng = np.random.default_rng(0)
    base = rng.normal(size=30).tolist()
    rows = _rows({("a", "flat", 0.1): base, ("b", "flat", 0.1): [v + 0.25 for v in base]}, field="delta_nll")
    boot = PairedBootstrap(rows, "delta_nll", resamples=500)
    diff = boot.difference("b/flat", 0.1, "a/flat", 0.1, ["t"])
    assert diff.mean == pytest.approx(0.25) and diff.low == pytest.approx(0.25) and diff.high == pytest.approx(0.25)
    single = boot.cell("a/flat", 0.1, "t")
    assert single.high - single.low > 0.4  # the cells themselves are wide: only pairing makes the difference sure
    assert diff.excludes_zero()


def test_interval_equals_a_brute_force_bootstrap():
    values = [0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    boot = PairedBootstrap(_rows({("a", "flat", 0.5): values}), "score", resamples=2000, seed=3)
    draws = boot.draws["t"]
    means = np.asarray(values)[draws].mean(1)
    interval = boot.cell("a/flat", 0.5, "t")
    assert interval.mean == pytest.approx(np.mean(values))
    assert (interval.low, interval.high) == pytest.approx(tuple(np.percentile(means, [2.5, 97.5])))
    again = PairedBootstrap(_rows({("a", "flat", 0.5): values}), "score", resamples=2000, seed=3)
    assert again.cell("a/flat", 0.5, "t") == interval  # seeded: tables are reproducible


def test_questions_of_one_item_count_once():
    rows = _rows({("a", "flat", 0.5): [1.0, 0.0]})
    rows.append({**rows[0], "question": 1, "score": 0.0})  # item 0 now has questions scoring 1 and 0
    assert PairedBootstrap(rows, "score").cell("a/flat", 0.5, "t").mean == pytest.approx((0.5 + 0.0) / 2)


def test_items_of_two_seeds_are_two_contexts():
    """Item 0 of seed 0 and item 0 of seed 1 are other contexts: a store of both seeds counts two items, not one
    item with the two contexts' questions averaged."""
    rows = _rows({("a", "flat", 0.5): [1.0]}, seed=0) + _rows({("a", "flat", 0.5): [0.0]}, seed=1)
    boot = PairedBootstrap(rows, "score")
    assert boot.n_items("t") == 2 and boot.items["t"] == [(0, 0), (1, 0)]
    assert sorted(boot.values["t"][0].tolist()) == [0.0, 1.0]


def test_accuracy_average_leaves_out_tasks_the_model_cannot_do():
    rows = []
    for task, base in (("easy", [1.0] * 4), ("hard", [0.0] * 4)):
        rows += _rows({("none", "none", 1.0): base, ("a", "flat", 0.5): base}, task=task)
    for row in rows:
        row["delta_nll"] = 0.0 if row["press"] == "none" else 0.5
    report = GroupReport(rows, resamples=100)
    assert report.average_tasks["score"] == ["easy"] and report.average_tasks["delta_nll"] == ["easy", "hard"]
    text = report.markdown()
    assert "Left out (no prune below 10%): hard" in text


def test_tasks_a_method_never_ran_are_not_averaged():
    rows = _rows({("none", "none", 1.0): [1.0, 1.0], ("x", "flat", 0.5): [1.0, 1.0]}, task="a")
    rows += _rows({("none", "none", 1.0): [0.5, 0.5]}, task="b")
    for row in rows:
        row["delta_nll"] = 0.0
    report = GroupReport(rows, resamples=50)
    assert report.tasks == ["a"]
    assert report.boot["score"].average("none", 1.0, report.average_tasks["score"]).mean == 1.0


def test_summary_never_averages_different_settings(tmp_path):
    rows = _rows({("none", "none", 1.0): [1.0, 1.0]}) + _rows({("none", "none", 1.0): [0.0, 0.0]}, model="tiny")
    for row in rows:
        row["delta_nll"] = 0.0
    text = summary_markdown(rows, resamples=50)
    assert len(re.findall("^## ", text, re.M)) == 2 and "| no prune | 100.0 [100.0, 100.0]" in text
    assert "| no prune | 0.0 [0.0, 0.0]" not in text  # the tiny model is at 0 %: its accuracy is left out
    assert "50.0" not in text
    with pytest.raises(ValueError, match="one setting group; these rows hold 2"):
        plot_curves(rows, tmp_path / "x.png")


def test_pairwise_table_marks_ties_and_real_differences():
    rng = np.random.default_rng(1)
    base = rng.normal(1.0, 1.0, size=20)
    rows = _rows({("none", "none", 1.0): [0.0] * 20, ("good", "flat", 0.1): (base * 0.1).tolist(),
                  ("bad", "flat", 0.1): (base * 0.1 + 1.0).tolist(),
                  ("same", "flat", 0.1): (base * 0.1 + rng.normal(0, 0.001, 20)).tolist()}, field="delta_nll")
    for row in rows:
        row["score"] = 1.0
    lines = GroupReport(rows, resamples=500).pairwise_markdown("delta_nll", 0.1)
    by_row = {line.split("|")[1].strip(): line for line in lines if line.startswith("| ") and "/" in line.split("|")[1]}
    cells = [c.strip() for c in by_row["good/flat"].split("|")[2:-1]]
    header = [c.strip() for c in lines[2].split("|")[2:-1]]
    verdict = dict(zip(header, cells))
    assert verdict["bad/flat"].startswith("▲")  # lower ΔNLL is better
    assert verdict["same/flat"].startswith("=")
    assert verdict["no prune"].startswith("▼")


def test_plot_of_one_ratio_uses_error_bars(tmp_path):
    rows = _rows({("none", "none", 1.0): [1.0, 0.0, 1.0], ("a", "flat", 0.2): [1.0, 0.0, 0.0]})
    for row in rows:
        row["delta_nll"] = 0.1
    path = plot_curves(rows, tmp_path / "one.png", resamples=50)
    assert path.stat().st_size > 1000


def test_a_report_never_prints_nan_or_inf():
    """Probe of issue 64: values near the float range published ``[8.822, nan]`` (their resampled means overflow);
    a report shows a number that is none as "–", and the summary of such rows holds no nan or inf."""
    from bench.reports.stats import Interval

    assert Interval(float("nan"), 1.25, float("inf")).format(1, 2) == "– [1.25, –]"
    rows = _rows({("none", "none", 1.0): [0.0] * 3, ("a", "flat", 0.5): [1e308, 1e308, 0.5]}, field="delta_nll")
    text = summary_markdown([{**row, "score": 1.0, "answer_nll": 0.0, "kl": 0.0, "agree": True} for row in rows],
                            resamples=50)
    assert not re.search(r"\bnan\b|\binf\b", text), text

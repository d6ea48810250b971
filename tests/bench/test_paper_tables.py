"""The paper's Tables 3 and 4 from constructed rows: the right methods, benchmarks and paired differences."""

import numpy as np
import pytest

from bench.reports.paper_tables import benchmarks, table3_markdown, table4_markdown
from bench.reports.report import GroupReport
from bench.reports.stats import PairedBootstrap

GROUP = {"model": "m", "weights": "w", "profile": "compact", "length": 512, "code": "c"}
FRACTIONS = (0.1, 0.4, 0.7)


def _rows(methods: dict[str, float], tasks=("niah_single_1", "niah_multikey_1"), haystacks=("generated", "manpages")):
    """Every method at every fraction on every task and haystack; item values = base(item) + the method's shift,
    so every paired difference is exactly the difference of shifts."""
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.6, size=20)
    rows = []
    for haystack in haystacks:
        for task in tasks:
            for method, shift in methods.items():
                press, alloc = method.split("/")
                for p in (1.0,) if press == "none" else FRACTIONS:
                    for item, b in enumerate(base):
                        value = b + shift * (p if press != "none" else 1)
                        rows.append({**GROUP, "press": press, "allocator": alloc, "keep_fraction": p, "task": task,
                                     "haystack": haystack, "item": item, "question": 0, "score": value,
                                     "delta_nll": -value})
    return rows


METHODS = {"none/none": 0.3, "gatesight/gate": 0.2, "kvzip/global": 0.1, "gatesight/flat": 0.0,
           "gatesight/pyramid": 0.2}


def test_benchmarks_split_tasks_by_haystack():
    assert benchmarks(["b@nodejs-docs", "a", "a@manpages", "b"]) == {
        "generated": ["a", "b"], "manpages": ["a@manpages"], "nodejs-docs": ["b@nodejs-docs"]}


def test_table3_differences_are_the_paired_shifts_with_zero_width():
    report = GroupReport(_rows(METHODS), resamples=200)
    text = "\n".join(table3_markdown(report))
    # gatesight/gate − kvzip/global = (0.2 − 0.1)·p: at p = 0.7, 7.0 points; the mean over 0.1, 0.4, 0.7: 4.0
    assert "| | GateSight − KVzip | ▲ 7.0 [7.0, 7.0] | ▲ 4.0 [4.0, 4.0] | ▲ 1.0 [1.0, 1.0] | ▲ 4.0 [4.0, 4.0] |" in text
    # ΔNLL is −score here: lower is better, so GateSight's lower ΔNLL is marked better too
    assert "| | GateSight − KVzip | ▲ -0.070 [-0.070, -0.070] |" in text
    assert text.count("| | GateSight − KVzip |") == 4  # two benchmarks × two metrics
    assert "generated (2 tasks, n ≥ 20)" in text and "manpages (2 tasks, n ≥ 20)" in text
    boot = PairedBootstrap(_rows(METHODS), "score", resamples=200)
    tasks = ["niah_single_1", "niah_multikey_1"]
    mean = boot.mean_over_fractions("gatesight/gate", list(FRACTIONS), tasks)
    assert mean.mean == pytest.approx(np.mean([boot.average("gatesight/gate", p, tasks).mean for p in FRACTIONS]))


def test_table4_ablation_ties_when_the_allocators_agree():
    report = GroupReport(_rows(METHODS), resamples=200)
    text = "\n".join(table4_markdown(report))
    assert "| | gate − flat | ▲ 2.0 [2.0, 2.0] | ▲ 8.0 [8.0, 8.0] | ▲ 14.0 [14.0, 14.0] | ▲ 8.0 [8.0, 8.0] |" in text
    assert "| | gate − pyramid | = 0.0 [0.0, 0.0] | = 0.0 [0.0, 0.0] | = 0.0 [0.0, 0.0] | = 0.0 [0.0, 0.0] |" in text


def test_tables_are_left_out_when_their_methods_did_not_run():
    report = GroupReport(_rows({"none/none": 0.3, "gatesight/gate": 0.2, "gatesight/flat": 0.0}), resamples=50)
    assert table3_markdown(report) == [] and table4_markdown(report) == []

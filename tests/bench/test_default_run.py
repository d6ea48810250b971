"""The first run a newcomer makes, ``bench compare --press gatesight --alloc flat``: its workload shows what eviction
costs on the shipped model, and its plot's title counts methods, not kept fractions."""

from collections import defaultdict

import pytest

from bench.commands.cli import build_parser, main
from bench.reports import report
from bench.run.compare import CompareSettings, run_compare, run_rows


@pytest.mark.slow  # ~11 s: the shipped model on the default tasks; CI's slow run holds it
def test_the_default_workload_shows_what_eviction_costs(tmp_path):
    defaults = build_parser().parse_args(["compare", "--press", "gatesight", "--alloc", "flat"])
    settings = CompareSettings(presses=defaults.press, allocators=defaults.alloc, keep_fractions=[0.02, 0.9],
                               tasks=defaults.tasks, n=3, length=defaults.length, out=tmp_path)  # the shipped model
    scores = defaultdict(list)
    for row in run_rows(run_compare(settings, show_progress=False), settings):
        scores[row["keep_fraction"]].append(row["score"])
    accuracy = {p: sum(values) / len(values) for p, values in scores.items()}
    assert accuracy[1.0] >= 0.5, accuracy  # the full cache answers the default tasks
    assert accuracy[0.02] <= accuracy[1.0] - 0.3, accuracy  # and a 2 % cache visibly does not


@pytest.mark.slow  # ~3 s: two runs, each plotted; CI's slow run holds it
def test_the_plot_title_counts_methods(model_dir, tmp_path, monkeypatch):
    titles, drawn = [], report.plot_curves

    def plot(rows, path, title, *rest):
        titles.append(title)
        return drawn(rows, path, title, *rest)

    monkeypatch.setattr(report, "plot_curves", plot)
    common = ["compare", "--model", str(model_dir), "--tasks", "niah_single_1", "--n", "1", "--length", "300"]
    assert main([*common, "--press", "keydiff", "--keep-fractions", "0.2,0.5,0.8", "--out", str(tmp_path / "a")]) == 0
    assert main([*common, "--methods", "keydiff/flat,snapkv/pyramid", "--keep-fractions", "0.5",
                 "--out", str(tmp_path / "b")]) == 0
    assert [title.split(" · ")[0] for title in titles] == ["1 method(s)", "2 method(s)"]
    assert (tmp_path / "a" / "curves.png").stat().st_size > 0

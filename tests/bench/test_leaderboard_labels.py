"""A label is shown as it is in the Markdown of ``leaderboard.md`` and ``summary.md`` (probe 16, U2): a chat template's
``<s>`` was written as is, so GitHub struck the rest through (and dropped an unknown tag), and ``*`` or ``_``
emphasised, so two labels could show alike. Each character Markdown reads as markup is set behind a backslash; the
page shows the text itself; a label without such characters (every published one) is written as before."""

import pytest

from bench.reports.leaderboard_page import _blocks
from bench.reports.markdown_text import escaped
from bench.reports.report import summary_markdown
from bench.run.compare import run_compare
from tests.helpers import compare_settings, run_cli, stored_rows

LABELS = {"kvzip(prompt=<s>a)/flat": r"kvzip(prompt=\<s\>a)/flat",
          "kvzip(prompt=a)/flat": "kvzip(prompt=a)/flat",
          "kvzip(prompt=*b*_c_`d`\\&e~$)/flat": r"kvzip(prompt=\*b\*\_c\_\`d\`\\\&e\~\$)/flat"}
"""Each label of the run, and how its Markdown cells write it."""


@pytest.fixture(scope="module")
def run(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("labels") / "run"
    pairs = [label.replace("(", "[").replace(")/", "]/") for label in LABELS]
    run_compare(compare_settings(model_dir, out, presses=[], allocators=[], pairs=pairs), show_progress=False)
    return out


def test_labels_are_escaped_in_markdown_cells_and_shown_as_they_are_on_the_page(run, tmp_path, capsys):
    code, err = run_cli(capsys, "leaderboard", run, "--out", tmp_path / "docs")
    assert code == 0, err
    for text in ((tmp_path / "docs" / "leaderboard.md").read_text(), summary_markdown(stored_rows(run), resamples=10)):
        cells = {line.split(" | ")[0].removeprefix("| ") for line in text.splitlines() if line.startswith("| ")}
        assert set(LABELS.values()) <= cells, cells
        assert not set(LABELS) - set(LABELS.values()) & cells, cells
        assert "### kvzip(prompt=\\<s\\>a)/flat: per task" in text
    for label, cell in LABELS.items():
        assert escaped(label) == cell
        assert _blocks([f"| {cell} | 1 |"]) == [["table", [[label, "1"]]]]
    assert run_cli(capsys, "verify", run, "--docs", tmp_path / "docs")[0] == 0


@pytest.mark.parametrize("label", ["kvzip/head_shares", "kvpress:TOVAPress/flat",
                                   "gatesight(estimator=46e464d1a968)/global", "niah_single_1@manpages"])
def test_a_label_without_markup_is_written_as_it_is(label):
    """The published labels hold no markup (an ``_`` between letters emphasises nothing): the leaderboard keeps its
    bytes."""
    assert escaped(label) == label

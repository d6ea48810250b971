"""A label naming the model's own artifact by its files' fingerprint (``gatesight(estimator=<the default model's>)``)
is no label a run writes: a run given the model's own folder leaves the option out. Beside the plain ``gatesight`` it
read as a second method of one setting, and carry failed only after a rerun (probe 22, #2). Every reader refuses it
where the group's model is here, naming file and line."""

import json

import pytest

from bench.store.carried_checks import SHIPPED_DEFAULT
from presses.gatesight import GateSightPress
from pretrained.fingerprints import files_fingerprint
from tests.helpers import assert_reports_refuse, published_rows, run_cli


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    """The first item of every context of the committed default model's 4,096-token group, its run's record left out
    (item 0 alone is then a complete store, as rows written before runs were recorded)."""
    return [{key: value for key, value in row.items() if key not in ("run", "questions", "batch")}
            for row in published_rows()
            if row["item"] == 0 and row["model"] == SHIPPED_DEFAULT.name and row["length"] == 4096]


def _store(rows: list[dict], directory, label: str):
    directory.mkdir()
    relabelled = [{**row, "press": label} if row["press"] == "gatesight" else row for row in rows]
    (directory / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in relabelled))
    return directory


def test_the_model_s_own_estimator_named_is_refused_by_every_reader(rows, tmp_path, capsys):
    folder, patterns = GateSightPress.artifact_files["estimator"]
    own = files_fingerprint(SHIPPED_DEFAULT / folder, patterns)
    other = "0123456789ab" if own != "0123456789ab" else "0123456789ac"
    assert run_cli(capsys, "verify", _store(rows, tmp_path / "other", f"gatesight(estimator={other})"))[0] == 0
    label = f"gatesight(estimator={own})"
    bad = _store(rows, tmp_path / "own", label)
    at = next(i for i, row in enumerate(rows) if row["press"] == "gatesight") + 1
    assert_reports_refuse(capsys, bad, tmp_path / "docs", (
        f"{bad / 'results.jsonl'}:{at}: press: the label {label!r} names {SHIPPED_DEFAULT.name}'s own estimator (its "
        f"files' fingerprint {own}), which a run reads when not told and leaves out of its label: this bench shows "
        "that setting as 'gatesight', so its rows name no method a rerun here could match"))
    code, err = run_cli(capsys, "merge", bad, "--out", tmp_path / "merged")
    assert code == 2 and f"{bad / 'results.jsonl'}:{at}: press: the label {label!r} names" in err, err

"""``bench cost``'s rows: each press's scoring time with the prefill's at each length, and the one as a multiple of
the other (``prefill_multiple``, not a "ratio": a ratio elsewhere is the evicted fraction), as the table prints it."""

import json

from bench.run.cost import run_cost


def test_cost_rows_give_scoring_time_as_a_multiple_of_prefill_time(model_dir, tmp_path):
    rows = run_cost(str(model_dir), ["keydiff", "snapkv"], [64, 96], tmp_path)
    assert [(r["press"], r["length"]) for r in rows] == [("keydiff", 64), ("snapkv", 64), ("keydiff", 96),
                                                         ("snapkv", 96)]
    for row in rows:
        assert set(row) == {"press", "length", "score_s", "prefill_s", "prefill_multiple"}
        assert row["score_s"] > 0 and row["prefill_s"] > 0
        assert row["prefill_multiple"] == row["score_s"] / row["prefill_s"]
    assert json.loads((tmp_path / "cost.json").read_text()) == rows
    table = (tmp_path / "cost.md").read_text().splitlines()
    for name in ("keydiff", "snapkv"):
        cells = [f"{r['score_s']:.4f} ({r['prefill_multiple']:.1%})" for r in rows if r["press"] == name]
        assert f"| {name} | {' | '.join(cells)} |" in table


def test_a_press_without_its_artifact_is_refused_with_advice_cost_takes(model_dir, tmp_path, capsys, no_model_load):
    """cost takes no press options (``estimator=`` is bench compare's): a press whose artifact the model's folder
    lacks is refused before the model loads, with the commands that write it there, never "pass estimator="."""
    import shutil

    from tests.helpers import run_cli

    model = shutil.copytree(model_dir, tmp_path / "model")
    shutil.rmtree(model / "gatesight")
    code, err = run_cli(capsys, "cost", "--model", model, "--press", "keydiff,gatesight", "--lengths", "64", "--out",
                        tmp_path / "cost")
    assert code == 2, err  # run_cli checks the error is one line, the last
    assert f"--press gatesight: bench cost times it with its default options, which read its estimator from the " \
           f"model's own folder, {model / 'gatesight'}, and none is there" in err, err
    assert f"`bench label --model {model} --out LABELS` then `bench train --model {model} --labels LABELS`" in err
    assert "estimator=" not in err and not (tmp_path / "cost").exists()

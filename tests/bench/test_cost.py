"""``bench cost``'s rows: each press's scoring time with the prefill's at each length, and the one as a multiple of
the other (``prefill_multiple``, not a "ratio": a ratio elsewhere is the evicted fraction), as the table prints it."""

import json

from bench.cost import run_cost


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

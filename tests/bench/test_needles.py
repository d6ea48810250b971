"""Needle recall and rank (bench.run.needles) against hand-made plans and brute-force ranking; the rows of a NIAH
comparison carry them."""

import json

import pytest
import torch

from bench.reports.needle_table import needle_markdown
from bench.run.compare import CompareSettings, run_compare
from bench.run.needles import needle_positions, needle_rank, needle_recall
from bench.store.row_fields import mean_over_heads
from hybridmodel.tokenizer import build_tokenizer
from runtime import KeepPlan, encode_text


def test_needle_positions_are_the_tokens_of_the_sentence():
    tokenizer = build_tokenizer()
    encode = lambda text: encode_text(tokenizer, text)  # noqa: E731
    context = "Header.\n\nSome filler. The magic number for abc is 1234.\nMore filler. Another: xyz.\n"
    positions = needle_positions(encode, context, ["The magic number for abc is 1234.", "Another: xyz."])
    ids = encode(context)
    decoded = tokenizer.decode([ids[i] for i in positions.tolist()])
    assert decoded == "The magic number for abc is 1234.Another: xyz."
    answers = needle_positions(encode, context, ["The magic number for abc is 1234."], ["1234"])
    assert tokenizer.decode([ids[i] for i in answers.tolist()]) == "1234"
    with pytest.raises(ValueError, match="is not in the context"):
        needle_positions(encode, context, ["missing sentence"])


def test_needle_recall_of_hand_made_plans():
    positions = torch.tensor([10, 11, 12, 13])
    plan = KeepPlan({3: [torch.arange(4, 20), torch.tensor([10, 12, 30])], 7: [torch.tensor([5]), torch.tensor([13])]})
    recall = needle_recall(plan, positions)
    assert recall == {"3": [1.0, 0.5], "7": [0.0, 0.25]}
    assert mean_over_heads(recall) == pytest.approx((1 + 0.5 + 0 + 0.25) / 4)


def test_needle_rank_equals_brute_force():
    torch.manual_seed(0)
    protected, n_body = 4, 50
    scores = {3: torch.randn(2, n_body), 7: torch.randint(0, 5, (2, n_body)).float()}  # layer 7 has ties
    positions = torch.tensor([protected + 3, protected + 17, protected + 40])
    ranks = needle_rank(scores, positions, protected)
    for layer, s in scores.items():
        for h in range(2):
            expected = []
            for p in (positions - protected).tolist():
                others = torch.cat([s[h, :p], s[h, p + 1:]])
                expected.append(((others > s[h, p]).sum() + 0.5 * (others == s[h, p]).sum()).item() / (n_body - 1))
            assert ranks[str(layer)][h] == pytest.approx(sum(expected) / len(expected))
    top = {3: torch.arange(n_body, 0, -1).float()[None].repeat(2, 1)}  # entry 0 first
    assert needle_rank(top, torch.tensor([protected]), protected)["3"] == [0.0, 0.0]


def test_niah_rows_carry_needle_diagnostics(model_dir, tmp_path):
    settings = CompareSettings(presses=["keydiff"], allocators=["flat"], keep_fractions=[0.3, 1.0],
                               tasks=["niah_multikey_1"], n=1, length=384, model=str(model_dir),
                               out=tmp_path / "results", haystack="nodejs-docs")
    run_compare(settings, show_progress=False)
    rows = [json.loads(line) for line in (tmp_path / "results" / "results.jsonl").read_text().splitlines()]
    compacted = [r for r in rows if r["press"] == "keydiff"]
    assert {r["haystack"] for r in rows} == {"nodejs-docs"} and len(compacted) == 8
    for row in compacted:
        layers = row["needle_recall_layers"]
        assert set(layers) == {"1", "3"} and all(len(heads) == 2 for heads in layers.values())
        assert row["needle_recall"] == pytest.approx(mean_over_heads(layers))
        assert row["answer_recall"] == pytest.approx(mean_over_heads(row["answer_recall_layers"]))
        assert set(row["answer_rank_layers"]) == {"1", "3"}
        if row["keep_fraction"] == 1.0:  # keeping everything keeps every needle token
            assert row["needle_recall"] == row["answer_recall"] == 1.0
    assert "| keydiff/flat | 1 | 100 / 100 |" in needle_markdown(rows)
    assert all("needle_recall" not in r for r in rows if r["press"] == "none")


def test_leaderboard_needle_recall_is_the_rows_answer_recall_with_paired_intervals():
    from bench.reports.leaderboard import needle_recall_markdown

    group = {"model": "m", "weights": "w", "profile": "compact", "length": 512, "code": "c"}
    rows = []
    for item in range(10):
        base = {**group, "task": "niah_single_2", "haystack": "manpages", "item": item, "question": 0}
        rows.append({**base, "press": "none", "allocator": "none", "keep_fraction": 1.0})  # carries no recall
        rows.append({**base, "press": "snapkv", "allocator": "flat", "keep_fraction": 0.1, "answer_recall": 0.5})
        rows.append({**base, "press": "kvzip", "allocator": "global", "keep_fraction": 0.1,
                     "answer_recall": item / 10})
    text = "\n".join(needle_recall_markdown(rows, resamples=200))
    assert "| snapkv/flat | 50 [50, 50] |" in text  # the same on every item: an interval of zero width
    kvzip = next(line for line in text.splitlines() if line.startswith("| kvzip/global |"))
    mean, low, high = (float(x) for x in kvzip.split("|")[2].replace("[", "").replace("]", "").replace(",", "").split())
    assert mean == 45 and low < mean < high  # items 0.0 … 0.9: the mean 0.45, an interval that varies
    assert "none" not in text and "(n ≥ 10 each)" in text
    assert needle_recall_markdown([{k: v for k, v in r.items() if k != "answer_recall"} for r in rows]) == []

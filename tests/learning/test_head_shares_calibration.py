"""``bench calibrate-shares``: shares from KVzip's global allocations, their stability, and the file they ship in."""

import shutil

import pytest
import torch

import allocators
import presses
from allocators import HeadShares
from allocators.head_shares import FILE
from bench.commands.cli import main
from gatesight_learning import head_shares as calibration
from gatesight_learning.evaluate import spearman
from gatesight_learning.record import CHAT_PREFIX
from pretrained.loading import load
from runtime import encode_text, prefill


def test_window_shares_are_the_global_counts_over_the_budget(tiny):
    parent = prefill(tiny("qwen3_5"), torch.randint(0, 97, (120,), generator=torch.Generator().manual_seed(0)),
                     protected=4)
    scores = {layer: torch.rand(2, 116, generator=torch.Generator().manual_seed(layer))
              for layer in parent.adapter.attention_layers}
    shares = calibration.window_shares(parent, scores, (0.1, 0.5))
    for row, p in zip(shares, (0.1, 0.5)):
        request = allocators.BudgetRequest(p, 116, parent.adapter.attention_layers, 2, scores=scores)
        counts = allocators.get("global").allocate(request)
        expected = [c / request.total for layer in parent.adapter.attention_layers for c in counts[layer]]
        assert row.tolist() == pytest.approx(expected) and float(row.sum()) == pytest.approx(1.0)


def test_stability_is_the_spearman_of_every_pair():
    windows = torch.tensor([[0.1, 0.2, 0.7], [0.2, 0.1, 0.7], [0.7, 0.2, 0.1]], dtype=torch.float64)
    found = calibration.stability(windows)
    rhos = [spearman(windows[0], windows[1]), spearman(windows[0], windows[2]), spearman(windows[1], windows[2])]
    assert found["pairs"] == 3 and found["spearman_mean"] == pytest.approx(sum(rhos) / 3)
    assert found["spearman_min"] == pytest.approx(-1.0) and found["spearman_max"] == pytest.approx(0.5)


def test_calibrate_shares_writes_shares_the_allocator_reads(model_dir, tmp_path, monkeypatch, capsys):
    """The command on two windows of given text: the file holds, at each kept fraction of the grid, the mean of the
    windows' global shares, with its provenance."""
    model = shutil.copytree(model_dir, tmp_path / "model")
    texts = [("licenses", "a-0", "Permission is granted to copy this text. " * 6),
             ("python-stdlib", "b-0", "def f(x):\n    return x + 1\n" * 8)]
    monkeypatch.setattr(calibration, "corpus_windows", lambda tokenizer, tokens, per_document, limit: texts[:limit])
    assert main(["calibrate-shares", "--model", str(model), "--windows", "2", "--tokens", "96"]) == 2  # held already
    assert "--replace" in capsys.readouterr().err
    assert main(["calibrate-shares", "--model", str(model), "--windows", "2", "--tokens", "96", "--replace"]) == 0
    assert "Spearman between windows over 1 pairs" in capsys.readouterr().out
    shipped = HeadShares.load(model)
    assert shipped.provenance["windows"] == 2
    assert shipped.provenance["documents"] == ["licenses/a-0", "python-stdlib/b-0"]
    loaded, tokenizer, _ = load(str(model))
    prefix = encode_text(tokenizer, CHAT_PREFIX)
    per_window = []
    for _, _, text in texts:
        ids = prefix + encode_text(tokenizer, text)[: 96 - len(prefix)]
        parent = prefill(loaded, torch.tensor(ids), protected=len(prefix), tokenizer=tokenizer)
        per_window.append(calibration.window_shares(parent, presses.Selection(parent, "kvzip").scores,
                                                    calibration.KEEP_FRACTIONS))
    mean = torch.stack(per_window).mean(0)  # [P, L·H]: at each kept fraction, the windows' mean
    assert sorted(shipped.by_fraction) == list(calibration.KEEP_FRACTIONS)
    for p, expected in zip(calibration.KEEP_FRACTIONS, mean.tolist()):
        at_p = shipped.by_fraction[p]
        assert [s for layer in sorted(at_p) for s in at_p[layer]] == pytest.approx(expected)
    assert (model / FILE).is_file() and list(model.glob("calibration.backup-*"))  # the fixture's moved aside

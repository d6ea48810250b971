"""The head_shares allocator: exact budgets from calibrated shares (by kept fraction, interpolated between them),
caps re-spread, its file refused when bad."""

import itertools
import json
import re

import pytest
import torch

import allocators
from allocators import BudgetRequest, HeadShares
from allocators.head_shares import FILE
from allocators.integerize import round_half_up
from runtime.errors import UsageError


def _request(p, n_body, layers, heads, shares):
    return BudgetRequest(keep_fraction=p, n_body=n_body, layers=layers, num_kv_heads=heads, head_shares=shares)


def _random_shares(layers, heads, generator, zeros=False):
    raw = torch.rand(len(layers), heads, generator=generator) ** 4  # skewed: some heads capped at small n_body
    if zeros:
        raw[0, 0] = 0.0
    return {layer: raw[i].tolist() for i, layer in enumerate(layers)}


def test_counts_sum_exactly_to_the_budget_within_the_body():
    allocator = allocators.get("head_shares")
    g = torch.Generator().manual_seed(0)
    for n_body, p, layers, heads in itertools.product([1, 7, 100, 1023], [0.01, 0.05, 0.3, 0.9, 1.0],
                                                      [(3,), (3, 7, 11), tuple(range(2, 30, 4))], [1, 3]):
        shares = _random_shares(layers, heads, g, zeros=len(layers) > 1)
        request = _request(p, n_body, layers, heads, shares)
        counts = allocator.allocate(request)
        assert sorted(counts) == list(layers) and all(len(c) == heads for c in counts.values())
        flat = [c for layer in layers for c in counts[layer]]
        assert sum(flat) == len(layers) * heads * round_half_up(p * n_body) == request.total
        assert all(0 <= c <= n_body for c in flat)


def test_uncapped_counts_are_the_shares_of_the_budget():
    g = torch.Generator().manual_seed(1)
    layers, heads = (1, 5, 9), 3
    shares = _random_shares(layers, heads, g)
    total = sum(s for h in shares.values() for s in h)
    request = _request(0.1, 100_000, layers, heads, shares)
    counts = allocators.get("head_shares").allocate(request)
    for layer in layers:
        for h in range(heads):
            assert abs(counts[layer][h] - request.total * shares[layer][h] / total) < 1


def test_a_capped_head_hands_its_excess_to_the_others_in_proportion():
    # B = 2 layers · 2 heads · round(0.5 · 100) = 200; head (1, 0) wants 0.7 · 200 = 140 > 100: capped at the body,
    # the 40 over it go to the others in proportion to their shares 0.1 : 0.1 : 0.1 (100 / 3 each; the unit left
    # goes to the first head on a tie of remainders)
    counts = allocators.get("head_shares").allocate(_request(0.5, 100, (1, 2), 2, {1: [0.7, 0.1], 2: [0.1, 0.1]}))
    assert counts == {1: [100, 34], 2: [33, 33]}
    # every head but one at zero share: the budget past its cap is spread evenly over the zero-share heads
    counts = allocators.get("head_shares").allocate(_request(0.5, 10, (1, 2), 2, {1: [1.0, 0.0], 2: [0.0, 0.0]}))
    assert counts == {1: [10, 4], 2: [3, 3]}


def test_shares_between_calibrated_fractions_are_interpolated_and_sum_exactly():
    g = torch.Generator().manual_seed(3)
    layers, heads = (3, 7, 11), 2
    grid = {p: _random_shares(layers, heads, g) for p in (0.1, 0.3, 0.6)}
    shares = HeadShares(grid)
    normalised = {p: HeadShares.of(s).at(p) for p, s in grid.items()}
    # at a calibrated fraction its own set, outside the grid the nearest one's
    assert shares.at(0.3) == normalised[0.3]
    assert shares.at(0.01) == normalised[0.1] and shares.at(1.0) == normalised[0.6]
    # between two: the straight line from one to the other (0.4 is a third of the way from 0.3 to 0.6)
    between = shares.at(0.4)
    for layer in layers:
        for h in range(heads):
            expected = normalised[0.3][layer][h] * 2 / 3 + normalised[0.6][layer][h] / 3
            assert between[layer][h] == pytest.approx(expected)
    assert sum(s for h in between.values() for s in h) == pytest.approx(1.0)
    allocator = allocators.get("head_shares")
    for p, n_body in itertools.product([0.02, 0.1, 0.2, 0.3, 0.45, 0.6, 0.95], [9, 100_000]):
        request = _request(p, n_body, layers, heads, shares)
        counts = allocator.allocate(request)
        assert sum(c for h in counts.values() for c in h) == request.total
        at_p = shares.at(p)
        if max(s for h in at_p.values() for s in h) * request.total <= n_body:  # uncapped: the shares of the budget
            assert all(abs(counts[layer][h] - request.total * at_p[layer][h]) < 1 for layer in layers
                       for h in range(heads))


def test_calibration_round_trips_to_the_same_counts(tmp_path):
    g = torch.Generator().manual_seed(2)
    layers, heads = (3, 7, 11), 3
    grid = {p: _random_shares(layers, heads, g) for p in (0.05, 0.3)}
    shares = HeadShares(grid, {"windows": 4, "sources": ["licenses"]}, "abc123")
    path = shares.save(tmp_path)
    assert path == tmp_path / FILE
    loaded = HeadShares.load(tmp_path)
    assert loaded.provenance == shares.provenance and loaded.weights == "abc123"
    assert sorted(loaded.by_fraction) == [0.05, 0.3]
    allocator = allocators.get("head_shares")
    for p, n_body in itertools.product([0.02, 0.05, 0.1, 0.3, 0.5], [50, 2000]):
        assert (allocator.allocate(_request(p, n_body, layers, heads, loaded))
                == allocator.allocate(_request(p, n_body, layers, heads, shares)))


def test_a_file_of_one_set_of_shares_serves_every_fraction(tmp_path):
    _write(tmp_path, '{"format": "hybridpress head shares 1", "weights": "abc", "shares": {"3": [1, 3], "5": [0, 4]}}')
    loaded = HeadShares.load(tmp_path)
    assert all(loaded.at(p) == {3: [0.125, 0.375], 5: [0.0, 0.5]} for p in (0.01, 0.3, 1.0))


def _write(tmp_path, text):
    (tmp_path / FILE).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / FILE).write_text(text)


@pytest.mark.parametrize("text,message", [
    ("{not json", r"head_shares.json: not valid JSON"),
    ('[1, 2]', r"not a head-shares file"),
    ('{"format": "hybridpress head shares 1", "shares": {"x": [1]}}', r"keyed by attention layer index"),
    ('{"format": "hybridpress head shares 1", "shares": {"3": [0.5, -0.1]}}', r"layer 3 has the share -0.1"),
    ('{"format": "hybridpress head shares 1", "shares": {"3": [0.5, "a"]}}', r"layer 3 has the share 'a'"),
    ('{"format": "hybridpress head shares 1", "shares": {"3": [0, 0]}}', r"every share is 0"),
    ('{"format": "hybridpress head shares 1", "shares": {"3": 0.5}}', r"layer 3 must hold a list of shares"),
    # re-probe of 64: without the weights they were measured on, shares of another model passed unseen
    ('{"format": "hybridpress head shares 1", "shares": {"3": [1, 1]}}', r"weights=None, expected the fingerprint"),
    ('{"format": "hybridpress head shares 1", "weights": 7, "shares": {"3": [1]}}', r"weights=7, expected the"),
    ('{"format": "hybridpress head shares 2", "weights": "a", "by_keep_fraction": []}', r"must map kept fractions"),
    ('{"format": "hybridpress head shares 2", "weights": "a", "by_keep_fraction": {"0": {"3": [1]}}}',
     r"keyed by kept fraction p in \(0, 1\], got '0'"),
    ('{"format": "hybridpress head shares 2", "weights": "a", "by_keep_fraction": {"half": {"3": [1]}}}',
     r"keyed by kept fraction p in \(0, 1\], got 'half'"),
    ('{"format": "hybridpress head shares 2", "weights": "a", "by_keep_fraction": {"0.1": [1]}}',
     r"give shares as \{layer: \[share per KV head\]\}"),
    ('{"format": "hybridpress head shares 2", "weights": "a", "by_keep_fraction": {"0.1": {"3": [1, 2]}, '
     '"0.5": {"3": [1]}}}', r"the shares at p = 0.5 cover other layers or heads than at p = 0.1"),
    ('{"format": "hybridpress head shares 2", "weights": "a", "by_keep_fraction": {"0.1": {"3": [1, 2]}, '
     '"0.5": {"3": [1, -2]}}}', r"at p = 0.5: layer 3 has the share -2"),
    # probe 10: an integer past the largest float ended in OverflowError; keys written two ways, the last won
    ('{"format": "hybridpress head shares 1", "weights": "a", "shares": {"3": [1, 1%s]}}' % ("0" * 309),
     r"head_shares.json: layer 3 has a share of 310 digits, past the largest float; a share is a finite number"),
    ('{"format": "hybridpress head shares 2", "weights": "a", "by_keep_fraction": {"0.5": {"3": [1, 1%s]}}}'
     % ("0" * 400), r"layer 3 has a share of 401 digits"),
    ('{"format": "hybridpress head shares 2", "weights": "a", "by_keep_fraction": {"0.5": {"3": [1]}, '
     '"0.50": {"3": [1]}}}', r"head_shares.json: the keys '0.5' and '0.50' are one kept fraction written two ways; "
                             r"keep one of them$"),
    ('{"format": "hybridpress head shares 1", "weights": "a", "shares": {"3": [1], "03": [0]}}',
     r"head_shares.json: the keys '3' and '03' are one attention layer written two ways; keep one of them$"),
])
def test_a_damaged_file_is_refused_in_one_line(tmp_path, text, message):
    _write(tmp_path, text)
    with pytest.raises(UsageError, match=message) as error:
        HeadShares.load(tmp_path)
    assert "\n" not in str(error.value)


def test_shares_that_sum_past_the_largest_float_are_normalised(tmp_path):
    """Probe 10: shares each 1e308 summed to inf, and every one became 0 ("every share is 0")."""
    _write(tmp_path, '{"format": "hybridpress head shares 1", "weights": "a", "shares": {"3": [1e308, 1e308], '
                     '"5": [1e308, 0]}}')
    assert HeadShares.load(tmp_path).at(0.5) == {3: [1 / 3, 1 / 3], 5: [1 / 3, 0.0]}


def test_a_dangling_link_is_named_with_where_it_leads(tmp_path):
    """Probe 10: "no head shares: run `bench calibrate-shares`", which then refused the link."""
    (tmp_path / FILE).parent.mkdir(parents=True)
    (tmp_path / FILE).symlink_to(tmp_path / "nowhere")
    with pytest.raises(UsageError, match="^" + re.escape(
            f"{tmp_path / FILE.parent}: head_shares.json is a link to {tmp_path / 'nowhere'}, which does not exist; "
            f"remove the link, then run `bench calibrate-shares --model {tmp_path}`") + "$"):
        HeadShares.load(tmp_path)


def test_missing_shares_and_wrong_shapes_are_refused(tmp_path):
    with pytest.raises(UsageError, match=r"no head shares at .*head_shares.json: run `bench calibrate-shares"):
        HeadShares.load(tmp_path)
    (tmp_path / FILE).mkdir(parents=True)
    with pytest.raises(UsageError, match="a folder, where head shares"):
        HeadShares.load(tmp_path)
    allocator = allocators.get("head_shares")
    with pytest.raises(UsageError, match="needs the model's calibrated head shares"):
        allocator.allocate(_request(0.1, 100, (3,), 2, None))
    with pytest.raises(UsageError, match=r"cover attention layers \[3\]; the model's are \[3, 7\]"):
        allocator.allocate(_request(0.1, 100, (3, 7), 2, {3: [1.0, 1.0]}))
    with pytest.raises(UsageError, match="give layer 3 3 heads; the model has 2 KV heads"):
        allocator.allocate(_request(0.1, 100, (3,), 2, {3: [1.0, 1.0, 1.0]}))


def test_the_model_directorys_shares_plan_the_children(model_dir):
    """Through the bench's path: the shares in the model's calibration folder, checked against its weights, set the
    per-head counts of a Selection's plan; shares of other weights are refused in one line."""
    import presses
    from presses.calibration import head_shares_for
    from pretrained.loading import load
    from runtime import prefill

    model = load(str(model_dir))[0]
    parent = prefill(model, torch.arange(3, 203) % 90, protected=8)
    plan = presses.Selection(parent, "keydiff").plan("head_shares", 0.25)
    shares = HeadShares.load(model_dir)
    expected = allocators.get("head_shares").allocate(_request(0.25, 192, parent.adapter.attention_layers,
                                                              parent.adapter.geometry.num_kv_heads, shares))
    assert len(shares.by_fraction) == 2 and shares.at(0.25) not in shares.by_fraction.values()  # interpolated
    assert {layer: [len(h) for h in heads] for layer, heads in plan.layers.items()} == expected
    assert len({c for counts in expected.values() for c in counts}) > 1  # not flat
    record = json.loads((model_dir / FILE).read_text())
    try:
        (model_dir / FILE).write_text(json.dumps({**record, "weights": "0" * 12}))
        with pytest.raises(UsageError, match="were measured on model weights 000000000000, not this model's"):
            head_shares_for(parent.adapter)
    finally:
        (model_dir / FILE).write_text(json.dumps(record))


def test_bench_compare_refuses_a_model_without_shares_before_any_context(model_dir, tmp_path, capsys):
    import shutil

    from bench.commands.cli import main

    model = shutil.copytree(model_dir, tmp_path / "model")
    (model / FILE).unlink()
    code = main(["compare", "--model", str(model), "--methods", "keydiff/head_shares", "--keep-fractions", "0.5",
                 "--tasks", "niah_single_1", "--n", "1", "--length", "300", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"no head shares at {model / FILE}" in err, err
    assert not list((tmp_path / "out").glob("*.jsonl"))

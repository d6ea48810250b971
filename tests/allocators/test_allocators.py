"""Allocators: exact integer budgets B = L·H_kv·round(p·(n − prot)), and each rule's shape."""

import itertools

import pytest
import torch

import allocators
from allocators import BudgetRequest, largest_remainder
from allocators.integerize import round_half_up

LAYER_SETS = [(3,), (3, 7, 11), tuple(range(3, 64, 4))]


def _request(p, n_body, layers, heads=2, **kw):
    return BudgetRequest(keep_fraction=p, n_body=n_body, layers=layers, num_kv_heads=heads, **kw)


@pytest.mark.parametrize("name", ["flat", "gate", "pyramid", "global"])
def test_totals_are_exact(name):
    allocator = allocators.get(name)
    g = torch.Generator().manual_seed(0)
    for n_body, p, layers in itertools.product([1, 7, 100, 1023, 4096], [0.01, 0.1, 0.25, 0.5, 0.9, 1.0], LAYER_SETS):
        weights = {layer: float(w) for layer, w in zip(layers, torch.rand(len(layers), generator=g) + 0.01)}
        scores = {layer: torch.rand(2, n_body, generator=g) for layer in layers}
        request = _request(p, n_body, layers, scores=scores, layer_weights=weights)
        counts = allocator.allocate(request)
        assert sorted(counts) == sorted(layers)
        flat_counts = [c for heads in counts.values() for c in heads]
        assert sum(flat_counts) == len(layers) * 2 * round_half_up(p * n_body) == request.total
        assert all(0 <= c <= n_body for c in flat_counts)


def test_budget_rounding_is_half_up():
    assert _request(0.5, 5, (1,)).per_head == 3  # 2.5 -> 3 (Python's round() would give 2)
    assert _request(0.1, 15, (1, 2), heads=4).total == 2 * 4 * 2


def test_gate_is_proportional():
    counts = allocators.get("gate").allocate(_request(0.2, 1000, (3, 7, 11), layer_weights={3: 1.0, 7: 2.0, 11: 3.0}))
    assert counts == {3: [100, 100], 7: [200, 200], 11: [300, 300]}


def test_gate_caps_at_body_and_respreads():
    counts = allocators.get("gate").allocate(_request(0.5, 100, (3, 7), layer_weights={3: 0.01, 7: 10.0}))
    assert counts[7] == [100, 100] and counts[3] == [0, 0]


def test_pyramid_schedule():
    counts = allocators.get("pyramid").allocate(_request(0.1, 1000, tuple(range(3, 64, 4)), heads=1))
    per_layer = [c[0] for c in counts.values()]
    assert per_layer == sorted(per_layer, reverse=True)
    assert per_layer[0] == pytest.approx(2 * 100 - 100 / 20, abs=1) and per_layer[-1] == pytest.approx(5, abs=1)
    tiny = allocators.get("pyramid").allocate(_request(0.05, 100, tuple(range(8)), heads=1))
    assert min(c[0] for c in tiny.values()) >= 4


def test_global_takes_the_top_scores():
    scores = {1: torch.tensor([[0.9, 0.1, 0.8], [0.0, 0.0, 0.0]]), 5: torch.tensor([[0.7, 0.2, 0.3], [0.6, 0.5, 0.4]])}
    counts = allocators.get("global").allocate(_request(0.5, 3, (1, 5), scores=scores))
    # B = 2 layers · 2 heads · round(1.5) = 8: the eight largest scores, 0.9 down to 0.2
    assert counts == {1: [2, 0], 5: [3, 3]}


def test_largest_remainder_matches_brute_force():
    g = torch.Generator().manual_seed(3)
    for _ in range(200):
        raw = torch.rand(5, generator=g) * 10
        total = int(raw.sum().round())
        targets = (raw * total / raw.sum()).tolist()
        got = largest_remainder(targets, total)
        assert sum(got) == total
        assert all(abs(a - t) < 1 for a, t in zip(got, targets))


def test_errors():
    with pytest.raises(ValueError, match="unknown allocator 'nope'; available: flat, gate, pyramid, global"):
        allocators.get("nope")
    for p in (0, -0.1, 1.5):
        with pytest.raises(ValueError, match=f"keep fraction {p} is outside"):
            _request(p, 10, (1,))
    with pytest.raises(ValueError, match="bench calibrate"):
        allocators.get("gate").allocate(_request(0.5, 10, (1,)))
    with pytest.raises(ValueError, match="cannot be split"):
        largest_remainder([1.0, 1.0], 5, 0, 2)


@pytest.mark.parametrize("name", ["adakv", "perlayer"])
def test_new_allocators_totals_are_exact(name):
    g = torch.Generator().manual_seed(1)
    for n_body, p, layers in itertools.product([1, 7, 100, 1023], [0.01, 0.1, 0.5, 1.0], LAYER_SETS):
        allocator = allocators.get(name, **({"weights": [float(i + 1) for i in range(len(layers))]}
                                            if name == "perlayer" else {}))
        scores = {layer: torch.rand(2, n_body, generator=g) for layer in layers}
        request = _request(p, n_body, layers, scores=scores)
        counts = allocator.allocate(request)
        flat_counts = [c for heads in counts.values() for c in heads]
        assert sum(flat_counts) == request.total and all(0 <= c <= n_body for c in flat_counts)
        # both keep each layer's share of the budget per layer (adakv) or per weights (perlayer)
        if name == "adakv":
            assert all(sum(c) == 2 * request.per_head for c in counts.values())


def test_adakv_equals_brute_force_selection():
    """Per layer: every head's top ``floor`` entries, then the best remaining entries of all heads together."""
    g = torch.Generator().manual_seed(2)
    scores = torch.rand(4, 50, generator=g)
    scores[0] *= 10  # head 0 holds the layer's largest scores: it should win most of the shared budget
    request = _request(0.2, 50, (3,), heads=4, scores={3: scores})
    counts = allocators.get("adakv", safeguard=0.2).allocate(request)[3]
    k, floor = 10, 2
    pool = []
    for h in range(4):
        ranked = sorted(range(50), key=lambda j: -float(scores[h, j]))
        pool += [(float(scores[h, j]), h) for j in ranked[floor:]]
    best = sorted(pool, reverse=True)[: 4 * k - 4 * floor]
    expected = [floor + sum(1 for _, h in best if h == head) for head in range(4)]
    assert counts == expected and counts[0] > k and min(counts) >= floor


def test_perlayer_is_proportional_and_checks_its_weights():
    counts = allocators.get("perlayer", weights=[1, 2, 3]).allocate(_request(0.2, 1000, (3, 7, 11)))
    assert counts == {3: [100, 100], 7: [200, 200], 11: [300, 300]}
    with pytest.raises(ValueError, match="perlayer has 2 weights; the model has 3 attention layers"):
        allocators.get("perlayer", weights=[1, 2]).allocate(_request(0.2, 1000, (3, 7, 11)))
    with pytest.raises(ValueError, match=r"perlayer option weights=\[1, nan\]: expected a finite number, got nan"):
        allocators.get("perlayer", weights=[1, float("nan")])
    with pytest.raises(ValueError, match=r"perlayer weights=\[1e-320, 1(\.0)?\]: the largest is more than 1e308 times"):
        allocators.get("perlayer", weights=[1e-320, 1])  # divided by the smallest: infinite
    assert allocators.get("perlayer", weights=[0, 4, 2]).weights == [0.0, 2.0, 1.0]


def test_perlayer_weights_of_one_ratio_are_one_setting():
    """Weights in one ratio are one setting, in one form whatever floats their division gives (0.3 / 0.1 is
    2.9999999999999996): one label, so that a run refuses the two as one setting given twice."""
    forms = ([0.1, 0.3], [1, 3], [1 / 3, 1], [0.7, 2.1])
    assert {tuple(allocators.options_of("perlayer", {"weights": w})["weights"]) for w in forms} == {(1.0, 3.0)}
    assert {tuple(allocators.get("perlayer", weights=w).weights) for w in forms} == {(1.0, 3.0)}


def test_adakv_children_are_ragged_and_exact(tiny):
    import presses
    from runtime import prefill

    model = tiny("qwen3_5")
    parent = prefill(model, torch.randint(0, 97, (80,), generator=torch.Generator().manual_seed(3)), protected=4)
    selection = presses.Selection(parent, "keydiff")
    plan = selection.plan("adakv", 0.25)
    assert plan.total() == 2 * 2 * 19
    child = parent.fork(plan)
    for layer, heads in plan.layers.items():
        top = [torch.sort(torch.sort(-selection.scores[layer][h], stable=True).indices[: len(heads[h])]).values + 4
               for h in range(2)]
        assert all(torch.equal(a, b) for a, b in zip(top, heads))
    assert child.kv_nbytes == sum(2 * (4 + len(p)) * 16 * 4 for heads in plan.layers.values() for p in heads)


@pytest.mark.parametrize("options,message", [
    ({"beta": 0}, r"beta=0.0: expected a number > 0"), ({"beta": -2.0}, r"beta=-2.0: expected a number > 0"),
    ({"beta": True}, r"pyramid option beta=True: expected a number"),
    ({"floor": -1}, r"floor=-1: expected an integer >= 0"),
])
def test_pyramid_options_outside_their_range_are_refused_when_built(options, message):
    with pytest.raises(ValueError, match=message):
        allocators.get("pyramid", **options)


def test_an_allocator_of_ones_own_registers_and_plans_by_name(tiny, monkeypatch):
    """``allocators.register`` as ``presses.register``: a class of one's own runs by its name in Selection.plan."""
    from dataclasses import dataclass

    import presses
    from runtime import prefill

    monkeypatch.setattr(allocators, "ALLOCATORS", dict(allocators.ALLOCATORS))

    @allocators.register
    @dataclass
    class Lopsided(allocators.Allocator):
        """The first head of every layer keeps one entry more than flat, the second one fewer."""

        name = "lopsided"
        shift: int = 1

        def allocate(self, request):
            k = request.per_head
            return {layer: [k + self.shift, k - self.shift] for layer in request.layers}

    assert "lopsided" in allocators.available() and allocators.get("lopsided", shift="2").shift == 2
    parent = prefill(tiny("qwen3_5"), torch.randint(0, 97, (80,), generator=torch.Generator().manual_seed(3)),
                     protected=4)
    plan = presses.Selection(parent, "keydiff").plan("lopsided", 0.25)
    assert {layer: [len(h) for h in heads] for layer, heads in plan.layers.items()} == {
        layer: [20, 18] for layer in parent.adapter.attention_layers}
    assert "lopsided" not in __import__("serving").engine_allocators()  # runs_in_engine: False unless declared
    with pytest.raises(ValueError, match=r"allocator name 'lopsided' is taken by tests\.allocators\.test_allocators\."
                       r"\S+\.Lopsided: \S+\.Other cannot take it too"):  # each by its module (probe 23, U3)
        allocators.register(type("Other", (Lopsided,), {}))
    with pytest.raises(ValueError, match="register takes an Allocator subclass"):
        allocators.register(int)

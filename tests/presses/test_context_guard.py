"""Probe 12: a user's press that changed the context it scored (its cache in place, its ``kv`` dict, its fields)
corrupted every row of the run, the built-ins' and the no-prune baseline's included. Such a press is refused in one
line naming it and what it changed, before anything is computed from the changed context; a user's allocator reads
its own copy of the scores. Probe 13: a press of the project's own packages (a new file in ``presses/``) was not
checked; every press is, and every registered one is tested here to leave the context and the model as it found
them."""

import re

import pytest
import torch

import presses
from allocators.flat import FlatAllocator
from presses import Selection
from presses.context_guard import check_unchanged, fingerprint
from presses.keydiff import KeyDiffPress
from presses.kvpress_adapter import scorer_names
from runtime import adapter_for, model_guard, prefill
from runtime.errors import UsageError
from runtime.user_code import UserCodeError
from testing.offline import REGISTERED_PRESSES, offline_press
from tests.helpers import HYBRID_FAMILIES, token_ids


@pytest.fixture
def parent(tiny):
    torch.manual_seed(0)
    return prefill(tiny("qwen3_5"), torch.randint(0, 97, (40,)), protected=4)


def _users_press(change, module=__name__):
    """A press of ``module`` (this test module's: a user's, as an imported one is): KeyDiff's scores, then
    ``change(context)``."""
    def score(self, context):
        scores = KeyDiffPress.score(self, context)
        change(context)
        return scores
    return type("Changing", (KeyDiffPress,), {"score": score, "__module__": module})()


def _swap(keys):
    """Entries 3 and 4 of the first head swapped: every sum over the layer's values is kept."""
    keys[0, [3, 4]] = keys[0, [4, 3]].clone()


def _first_layer(parent):
    return parent.adapter.attention_layers[0]


@pytest.mark.parametrize("change, part", [
    (lambda c: c.kv[_first_layer(c)].keys.mul_(-1.0), "kv[{layer}].keys"),
    (lambda c: c.kv[_first_layer(c)].values[0, 5, 0].add_(1e-3), "kv[{layer}].values"),
    (lambda c: _swap(c.kv[_first_layer(c)].keys), "kv[{layer}].keys"),
    (lambda c: c.kv.clear(), "kv"),
    (lambda c: setattr(c, "n", 5), "n: 40 → 5"),
    (lambda c: setattr(c, "protected", 0), "protected: 4 → 0"),
    (lambda c: c.context_ids.zero_(), "context_ids"),
    (lambda c: next(iter(c.recurrent_states.values())).recurrent.zero_(), "recurrent_states["),
    (lambda c: next(iter(c.adapter.model.parameters())).mul_(1.0), "the model's weights"),
])
def test_a_users_press_changing_the_context_is_refused_naming_what(parent, change, part):
    with pytest.raises(UserCodeError, match=re.escape(f"press keydiff changed the context it scores "
                                                      f"({part.format(layer=_first_layer(parent))}")):
        Selection(parent, _users_press(change)).scores  # noqa: B018 - scored on first use


def test_a_press_of_the_projects_own_packages_is_checked_too(parent):
    """Probe 13: a press added as CONTRIBUTING.md says, one file in ``presses/``, negating the cache corrupted every
    row: a class of the project's packages was not checked."""
    press = _users_press(lambda c: c.kv[_first_layer(c)].keys.mul_(-1.0), module="presses.mine")
    with pytest.raises(UserCodeError, match=re.escape(f"press keydiff changed the context it scores "
                                                      f"(kv[{_first_layer(parent)}].keys)")):
        Selection(parent, press).scores  # noqa: B018 - scored on first use


def _kvpress_scorers() -> list[str]:
    """Every kvpress scorer that builds here (the others are refused when built, each with its reason)."""
    names = []
    for name in scorer_names():
        try:
            presses.get(f"kvpress:{name}")
        except UsageError:
            continue
        names.append(f"kvpress:{name}")
    return names


@pytest.mark.parametrize("family, press_name", [(family, name) for family in HYBRID_FAMILIES
                                                for name in REGISTERED_PRESSES]
                         + [("llama", name) for name in _kvpress_scorers()])  # full RoPE: every kvpress scorer runs
def test_every_registered_press_leaves_the_context_and_the_model_as_it_found_them(tiny, family, press_name):
    """The press's own ``score``, called directly (no guard around it): its context's fingerprint and its model —
    hooks, modules, parameters and buffers with their SHA-256, torch's functions — are as they were. A new press in
    the registry is held to it as soon as it is there."""
    model = tiny(family)
    press = offline_press(press_name, model)
    parent = prefill(model, token_ids(160, 0), protected=5, evidence=press.evidence(adapter_for(model)))
    before, held = fingerprint(parent), model_guard.HeldModel(model)
    scores = press.score(parent)
    check_unchanged(before, fingerprint(parent), f"press {press_name}")
    assert held.changed() is None
    assert set(scores) == set(parent.adapter.attention_layers)


def test_a_users_press_reading_only_scores_as_its_parent_class(parent):
    """The guard changes nothing of what a well-behaved user's press scores, nor its context."""
    before = fingerprint(parent)
    users = Selection(parent, _users_press(lambda context: None)).scores
    check_unchanged(before, fingerprint(parent), "the test")
    builtin = Selection(parent, KeyDiffPress()).scores
    assert users.keys() == builtin.keys() and all(torch.equal(users[k], builtin[k]) for k in users)


def test_the_fingerprint_tells_a_swap_a_sum_misses(parent):
    """Two entries of a layer swapped keep every sum of its values; the bytes' hash tells them apart."""
    before = fingerprint(parent)
    _swap(parent.kv[_first_layer(parent)].keys)
    with pytest.raises(UserCodeError, match=re.escape(f"(kv[{_first_layer(parent)}].keys)")):
        check_unchanged(before, fingerprint(parent), "press swapping")


@pytest.mark.parametrize("first", [True, False])
def test_a_users_allocator_changing_the_scores_changes_no_other_allocators_plan(parent, first):
    """Probe 12 row 20: a user's allocator that negated the press's scores in place gave the built-in allocators
    after it the negated scores; it now gets its own copy, whatever the order."""
    def allocate(self, request):
        for scores in request.scores.values():
            scores.neg_()
        return FlatAllocator.allocate(self, request)

    negating = type("Negating", (FlatAllocator,), {"allocate": allocate, "needs_scores": True})()
    reference = Selection(parent, KeyDiffPress()).plan("flat", 0.5)
    selection = Selection(parent, KeyDiffPress())
    scores = {layer: tensor.clone() for layer, tensor in selection.scores.items()}
    plans = [selection.plan(allocator, 0.5) for allocator in ((negating, "flat") if first else ("flat", negating))]
    assert all(torch.equal(selection.scores[layer], scores[layer]) for layer in scores)
    flat = plans[1] if first else plans[0]
    assert all(torch.equal(a, b) for layer in flat.layers
               for a, b in zip(flat.layers[layer], reference.layers[layer]))


def test_a_users_scores_are_read_once_into_a_plain_dict(parent):
    """Probe 12 (``ptrap``): scores in a dict of the user's whose ``__getitem__`` raised ended in a traceback from the
    bench's check; they are read once, into a plain dict, as the press returned them."""
    class Trap(dict):
        def __getitem__(self, layer):
            raise RuntimeError("read again")

    press = type("Trapping", (KeyDiffPress,), {"score": lambda self, context: Trap(KeyDiffPress.score(self,
                                                                                                      context))})()
    scores = Selection(parent, press).scores
    builtin = Selection(parent, KeyDiffPress()).scores
    assert type(scores) is dict and all(torch.equal(scores[k], builtin[k]) for k in builtin)

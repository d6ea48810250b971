"""What a library caller hands the registries and :func:`presses.compress` of the wrong kind — a name that is not
text, bench compare's bracket options, a budget out of range — is one :class:`~runtime.errors.UsageError` naming the
value and what is allowed, raised before the press is prepared or scores anything."""

import re
from dataclasses import dataclass

import numpy as np
import pytest
import torch

import allocators
import presses
from allocators.flat import FlatAllocator
from presses.keydiff import KeyDiffPress
from runtime import prefill
from runtime.errors import UsageError

PRESS_NAMES = ", ".join(presses.available())
ALLOCATOR_NAMES = ", ".join(allocators.available())


@dataclass
class _MustNotRun(presses.Press):
    """A press that fails the test if it is prepared or scores: a refusal must come before either."""

    name = "must-not-run"

    def bind(self, model_dir):
        pytest.fail("the press was prepared before the bad argument was refused")

    def score(self, context):
        pytest.fail("the press scored before the bad argument was refused")


@pytest.fixture
def parent(tiny):
    torch.manual_seed(0)
    return prefill(tiny("qwen3_5"), torch.randint(0, 97, (40,)), protected=4)


@pytest.mark.parametrize("name, shown", [(3, "int 3"), (None, "NoneType None"), (["snapkv"], "list ['snapkv']")])
def test_a_name_that_is_not_text_is_refused_naming_the_names(name, shown):
    with pytest.raises(UsageError) as error:
        presses.get(name)
    assert str(error.value) == f"presses.get takes a press name (text), one of: {PRESS_NAMES}; got {shown}"
    with pytest.raises(UsageError) as error:
        allocators.get(name)
    assert str(error.value) == f"allocators.get takes an allocator name (text), one of: {ALLOCATOR_NAMES}; got {shown}"


@pytest.mark.parametrize("name, keywords", [
    ("perlayer[weights=1/2]", "weights=[1, 2]"),
    ("pyramid[beta=4]", "beta=4"),
])
def test_an_allocator_with_bracket_options_says_how_the_library_takes_them(name, keywords):
    head = name.split("[")[0]
    cls = allocators.ALLOCATORS[head].__name__
    with pytest.raises(UsageError) as error:
        allocators.get(name)
    assert str(error.value) == (
        f"allocator {name!r}: options in brackets are bench compare's --alloc syntax; here name the allocator alone "
        f"and give its options as keywords, allocators.get({head!r}, key=value), or pass an Allocator instance, "
        f"{cls}(key=value): for these options, allocators.get({head!r}, {keywords})")


def test_a_press_with_bracket_options_shows_them_as_keywords():
    with pytest.raises(UsageError, match=r": for these options, presses.get\('snapkv', window=64, kernel=5\)$"):
        presses.get("snapkv[window=64,kernel=5]")
    with pytest.raises(UsageError, match=r"SnapKVPress\(key=value\)$"):  # not key=value pairs: no example
        presses.get("snapkv[window]")


@pytest.mark.parametrize("press, shown", [
    (3, "int 3"), (None, "NoneType None"), (KeyDiffPress, "the class KeyDiffPress")])
def test_compress_refuses_a_press_that_is_neither_a_press_nor_a_name(parent, press, shown):
    with pytest.raises(UsageError) as error:
        presses.compress(parent, press, "flat", keep_fraction=0.5)
    assert str(error.value) == f"press must be a Press instance or a press name ({PRESS_NAMES}), got {shown}"


@pytest.mark.parametrize("allocator, message", [
    (3, f"allocator must be an Allocator instance or an allocator name ({ALLOCATOR_NAMES}), got int 3"),
    (FlatAllocator, f"allocator must be an Allocator instance or an allocator name ({ALLOCATOR_NAMES}), got the "
                    "class FlatAllocator"),
    ("perlayer[weights=1/2]", "allocator 'perlayer[weights=1/2]': options in brackets are bench compare's --alloc "
                              "syntax; here name the allocator alone and give its options as keywords, "
                              "allocators.get('perlayer', key=value), or pass an Allocator instance, "
                              "PerLayerAllocator(key=value): for these options, allocators.get('perlayer', "
                              "weights=[1, 2])"),
])
def test_compress_refuses_a_bad_allocator_before_the_press_is_prepared(parent, allocator, message):
    with pytest.raises(UsageError) as error:
        presses.compress(parent, _MustNotRun(), allocator, keep_fraction=0.5)
    assert str(error.value) == message


@pytest.mark.parametrize("budget, message", [
    ({"compression_ratio": 1.0}, "compression_ratio 1.0 is outside [0, 1) (it is 1 - kept fraction)"),
    ({"compression_ratio": -0.1}, "compression_ratio -0.1 is outside [0, 1) (it is 1 - kept fraction)"),
    ({"compression_ratio": float("nan")}, "compression_ratio nan is outside [0, 1) (it is 1 - kept fraction)"),
    ({"compression_ratio": "0.5"}, "compression_ratio must be a number in [0, 1), got '0.5' (str)"),
    ({"keep_fraction": 0.0}, "keep fraction 0.0 is outside (0, 1]"),
    ({"keep_fraction": 1.5}, "keep fraction 1.5 is outside (0, 1]"),
    ({}, "give exactly one of keep_fraction (p) or compression_ratio (1 - p)"),
    ({"keep_fraction": 0.5, "compression_ratio": 0.5}, "give exactly one of keep_fraction (p) or compression_ratio "
                                                       "(1 - p)"),
])
def test_a_budget_out_of_range_is_named_with_its_range(parent, budget, message):
    with pytest.raises(UsageError) as error:
        presses.compress(parent, _MustNotRun(), "flat", **budget)
    assert str(error.value) == message


def test_a_selection_refuses_a_bad_plan_before_scoring(parent):
    selection = presses.Selection(parent, "keydiff")
    with pytest.raises(UsageError, match=r"^keep fraction 2 is outside \(0, 1\]$"):
        selection.plan("flat", 2)
    with pytest.raises(UsageError, match=r"^allocator must be an Allocator instance or an allocator name"):
        selection.plan(None, 0.5)
    assert selection.score_seconds is None  # nothing was scored


@pytest.mark.parametrize("given, shown", [
    (3, "int 3"), (None, "NoneType None"),
    ("a child", "a Child: a Child cannot be compressed again; compress the parent it was forked from at the kept "
                "fraction wanted")])
def test_compress_refuses_what_is_not_a_parent_before_the_press_is_prepared(parent, given, shown):
    if given == "a child":
        given = presses.compress(parent, "keydiff", "flat", keep_fraction=0.5)
    message = f"parent must be a runtime.Parent (the cache prefill returns), got {shown}"
    with pytest.raises(UsageError) as error:
        presses.compress(given, _MustNotRun(), "flat", keep_fraction=0.5)
    assert str(error.value) == message
    with pytest.raises(UsageError) as error:
        presses.Selection(given, _MustNotRun())
    assert str(error.value) == message


@pytest.mark.parametrize("weights, shown", [([1.0, 2.0], "list [1.0, 2.0]"), (np.array([1.0, 2.0]),
                                                                               "ndarray array([1., 2.])")])
def test_layer_weights_that_are_not_a_dict_are_refused_naming_the_form(parent, weights, shown):
    message = f"layer_weights must be a dict {{attention layer: weight}} or None, got {shown}"
    with pytest.raises(UsageError) as error:
        presses.compress(parent, _MustNotRun(), "gate", keep_fraction=0.5, layer_weights=weights)
    assert str(error.value) == message
    with pytest.raises(UsageError) as error:
        presses.Selection(parent, _MustNotRun(), weights)
    assert str(error.value) == message


def test_layer_weights_keyed_by_text_are_refused_naming_the_key(parent):
    """{'1': 1.0, '3': 2.0} said "no entry for attention layers [1, 3]" though both were given."""
    with pytest.raises(UsageError, match=r"layer_weights must be keyed by attention layer index \(an integer, e\.g\. "
                                         r"\{3: 1\.0\}\), got the key '1'"):
        presses.compress(parent, _MustNotRun(), "gate", keep_fraction=0.5, layer_weights={"1": 1.0, "3": 2.0})


@pytest.mark.parametrize("allocator, weights, message", [
    ("flat", {3: 1.0, 7: 9.0}, "layer_weights would be ignored: the 'flat' allocator does not read them; they split "
                               "the budget across layers for the allocators gate: leave them out, or use one of "
                               "those"),
    ("gate", {3: -1.0, 7: 1.0}, "layer_weights[3] = -1.0: a layer's weight must be a finite number >= 0"),
    ("gate", {3: float("nan"), 7: 1.0}, "layer_weights[3] = nan: a layer's weight must be a finite number >= 0"),
    ("gate", {3: float("inf"), 7: 1.0}, "layer_weights[3] = inf: a layer's weight must be a finite number >= 0"),
    ("gate", {3: 1.0, 7: 1.0, 9: 1.0, 0: 1.0}, "layer_weights name layers [0, 9] that are not attention layers of "
                                               "this model (its attention layers: 3, 7)"),
])
def test_layer_weights_nothing_reads_or_no_allocation_can_use_are_refused(parent, allocator, weights, message):
    """Each was ignored, or ran: a weight below zero or NaN, a layer the model does not have."""
    with pytest.raises(UsageError) as error:
        presses.compress(parent, _MustNotRun(), allocator, keep_fraction=0.5, layer_weights=weights)
    assert str(error.value).startswith(message), error.value
    if allocator == "gate":  # a Selection serves any allocator: the weights alone are checked there
        with pytest.raises(UsageError, match=re.escape(message)):
            presses.Selection(parent, _MustNotRun(), weights)


def test_layer_weights_the_gate_allocator_reads_are_taken(parent):
    """Layer 7 at three times layer 3's weight keeps three times its entries (the 36 body entries at p = 0.5 are
    18 per layer, 36 in all: 9 and 27)."""
    child = presses.compress(parent, "keydiff", "gate", keep_fraction=0.5, layer_weights={3: 1.0, 7: 3.0})
    assert {layer: child.kv[layer].lengths()[0] - parent.protected for layer in (3, 7)} == {3: 9, 7: 27}


@pytest.mark.parametrize("weights", [np.array([1, 2]), np.array([1.0, 2.0]), (1, 2), torch.tensor([1.0, 2.0]),
                                     range(1, 3), [np.int64(1), np.float32(2.0)]])
def test_perlayer_weights_take_any_one_dimensional_sequence_of_numbers(weights):
    built = allocators.get("perlayer", weights=weights)
    assert built == allocators.get("perlayer", weights=[1.0, 2.0])
    assert all(type(weight) is float for weight in built.weights)


@pytest.mark.parametrize("weights, shown", [(np.array([[1, 2]]), "array([[1, 2]])"), (["1", None], "['1', None]")])
def test_perlayer_weights_that_are_not_a_list_of_numbers_name_the_list(weights, shown):
    with pytest.raises(UsageError) as error:
        allocators.get("perlayer", weights=weights)
    assert str(error.value) == f"perlayer option weights={shown}: expected a list of numbers (e.g. [1, 2, 3])"


@pytest.mark.parametrize("returned, shown", [("a", "str 'a'"), (None, "NoneType None"), (2.5, "float 2.5"),
                                             (torch.tensor([1, 2]), "Tensor tensor([1, 2])")])
def test_a_chooser_that_returns_no_token_id_is_named(parent, returned, shown):
    child = presses.compress(parent, "keydiff", "flat", keep_fraction=0.5)
    with pytest.raises(UsageError) as error:
        child.answer(torch.tensor([1, 2]), 2, choose=lambda logits: returned)
    assert str(error.value) == (f"choose must return a token id (an integer, or a one-element integer tensor), "
                                f"got {shown}")


@pytest.mark.parametrize("chooser", [lambda logits: logits.argmax(), lambda logits: int(logits.argmax()),
                                     lambda logits: np.int64(logits.argmax()), lambda logits: logits.argmax()[None]])
def test_a_chooser_may_return_any_integer_form_of_the_argmax(parent, chooser):
    child = presses.compress(parent, "keydiff", "flat", keep_fraction=0.5)
    question = torch.tensor([1, 2])
    assert child.answer(question, 3, choose=chooser).tokens == child.answer(question, 3).tokens


@pytest.mark.parametrize("get, name, message", [
    ("allocators", "flat[x=1]", "; flat has no option 'x' (its options: none)"),
    ("presses", "snapkv[foo=2]", "; snapkv has no option 'foo' (its options: window, kernel, gqa)"),
])
def test_a_bracket_name_with_an_unknown_option_says_so_instead_of_a_call_that_fails(get, name, message):
    import allocators
    import presses

    registry = {"allocators": allocators, "presses": presses}[get]
    with pytest.raises(UsageError) as refused:
        registry.get(name)
    assert str(refused.value).endswith(message) and "for these options" not in str(refused.value)

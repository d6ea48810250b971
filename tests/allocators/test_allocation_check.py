"""Probe 11: a user allocator's allocation was never checked. A wrong or missing layer, layer keys as text, NaN,
None or text counts, or the wrong number of heads ended in ``KeyError``/``ValueError``/``IndexError`` deep in the
plan, or ran silently (counts as text). Each is refused in one line naming the allocator, the first bad value and what
an allocator returns; the project's own allocators and integer counts of numpy or torch pass."""

import re
import sys

import numpy as np
import pytest
import torch

import presses
from allocators import check_allocation
from allocators.flat import FlatAllocator
from presses.keydiff import KeyDiffPress
from runtime import prefill
from runtime.errors import UsageError


@pytest.fixture
def parent(tiny):
    torch.manual_seed(0)
    return prefill(tiny("qwen3_5"), torch.randint(0, 97, (40,)), protected=4)


def _allocator(edit):
    """A user's allocator: the flat allocation, edited by ``edit`` (``{layer: [count per head]}`` → what it returns)."""

    class Edited(FlatAllocator):
        name = "edited"

        def allocate(self, request):
            return edit({layer: list(counts) for layer, counts in super().allocate(request).items()}, request)

    return Edited()


def _moved(counts, request, to):
    first = request.layers[0]
    return {**{k: v for k, v in counts.items() if k != first}, to: counts[first]}


def _head(counts, request, value):
    first = request.layers[0]
    return {**counts, first: [value, *counts[first][1:]]}


@pytest.mark.parametrize("edit, problem", [
    (lambda c, r: None, "a NoneType, not a dict"),
    (lambda c, r: _moved(c, r, 99), "the key 99 (int), not an attention layer"),
    (lambda c, r: _moved(c, r, str(r.layers[0])), "the key '{first}' (str), not an attention layer"),
    (lambda c, r: {k: v for k, v in c.items() if k != r.layers[0]}, "no counts for attention layer {first}"),
    (lambda c, r: {**c, r.layers[0]: None}, "None for layer {first}"),
    (lambda c, r: {**c, r.layers[0]: [*c[r.layers[0]], 0]}, "{heads_plus} counts for layer {first}"),
    (lambda c, r: _head(c, r, float("nan")), "the count nan (float) for layer {first}"),
    (lambda c, r: _head(c, r, str(c[r.layers[0]][0])), "the count '{count}' (str) for layer {first}"),
    (lambda c, r: _head(c, r, True), "the count True (bool) for layer {first}"),
    (lambda c, r: _head(c, r, -1), "the count -1 (int) for layer {first}"),
    (lambda c, r: _head(c, r, c[r.layers[0]][0] - 1), "counts summing to {short}"),
])
def test_a_malformed_allocation_is_refused_naming_the_allocator_and_value(parent, edit, problem):
    request_of = {}

    def recorded(counts, request):
        request_of["request"], request_of["counts"] = request, counts
        return edit(counts, request)

    with pytest.raises(UsageError) as error:
        presses.compress(parent, KeyDiffPress(), _allocator(recorded), keep_fraction=0.5)
    request, counts = request_of["request"], request_of["counts"]
    first = request.layers[0]
    shown = problem.format(first=first, heads_plus=request.num_kv_heads + 1, count=counts[first][0],
                           short=request.total - 1)
    assert str(error.value) == (
        f"allocator edited returned {shown}; an allocator returns {{attention layer: [count per KV head]}} over the "
        f"layers {list(request.layers)}, each {request.num_kv_heads} integers in [0, {request.n_body}], summing to "
        f"{request.total}")
    assert "\n" not in str(error.value) and re.search("allocator edited", str(error.value))


@pytest.mark.parametrize("form", [np.int64, lambda count: torch.tensor(count), int])
def test_integer_counts_of_numpy_or_torch_are_taken(parent, form):
    selection = presses.Selection(parent, KeyDiffPress())
    edited = _allocator(lambda counts, request: {k: [form(c) for c in v] for k, v in counts.items()})
    assert selection.plan(edited, 0.5).counts() == selection.plan(FlatAllocator(), 0.5).counts()


def test_an_allocator_that_calls_sys_exit_is_named(parent):
    """Probe 11: ``sys.exit`` in a user's ``allocate`` ended the run silently with its status."""
    with pytest.raises(UsageError, match=re.escape("allocator edited called sys.exit(0) in allocate; a press or "
                                                   "allocator the bench runs returns its result and never ends the "
                                                   "process") + "$"):
        presses.compress(parent, KeyDiffPress(), _allocator(lambda counts, request: sys.exit(0)), keep_fraction=0.5)


class _Flipping(dict):
    """Counts that are right the first ``right`` times one is read, then a million each."""

    def __init__(self, counts, right):
        super().__init__(counts)
        self.reads, self.right = 0, right

    def __getitem__(self, layer):
        self.reads += 1
        return dict.__getitem__(self, layer) if self.reads <= self.right else [10**6] * len(dict.__getitem__(self,
                                                                                                             layer))


@pytest.mark.parametrize("right", [0, 3, 6])
def test_an_allocation_is_read_once_and_planned_from_as_checked(parent, right):
    """Probe 12 (``aflip``): a dict of the user's that gave other counts each time they were read passed the check and
    was planned from with the later ones, which broke the budget after the rows were written. The allocation is read
    once into plain counts, which the check returns and the plan reads."""
    selection = presses.Selection(parent, KeyDiffPress())
    flipping = _allocator(lambda counts, request: _Flipping(counts, right))
    assert selection.plan(flipping, 0.5).counts() == selection.plan(FlatAllocator(), 0.5).counts()


def test_the_checked_allocation_is_plain_counts(parent):
    counts = {}
    request_of = {}

    def recorded(given, request):
        request_of["request"] = request
        counts.update(given)
        return {layer: torch.tensor(c) for layer, c in given.items()}

    presses.compress(parent, KeyDiffPress(), _allocator(recorded), keep_fraction=0.5)
    plain = check_allocation({np.int64(k): torch.tensor(v) for k, v in counts.items()}, request_of["request"],
                             FlatAllocator())
    assert type(plain) is dict and plain == counts
    assert all(type(layer) is int and type(c) is int for layer, heads in plain.items() for c in heads)

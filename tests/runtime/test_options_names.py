"""A registered method's name is one the command line can give."""

import dataclasses

import pytest

import allocators
import presses
from allocators.flat import FlatAllocator
from presses.snapkv import SnapKVPress
from runtime.errors import UsageError


@pytest.mark.parametrize("name", ["a[b]", "a/b", "a,b", " ", "a\nb", "snäp", "../x", 5, None])
def test_a_name_the_command_line_cannot_give_is_refused_at_register(name):
    """Probe 7: names with brackets, slashes, commas, blanks or newlines were registered (and listed), though
    --press splits on commas and reads brackets as options and --methods splits on slashes; a name of 5 was an
    AttributeError."""
    with pytest.raises(UsageError, match="name is text of ASCII letters, digits, '_', '-' and '.'"):
        presses.register(dataclasses.dataclass(type("Odd", (SnapKVPress,), {"name": name})))
    with pytest.raises(UsageError, match="name is text of ASCII letters"):
        allocators.register(dataclasses.dataclass(type("Odd", (FlatAllocator,), {"name": name})))
    assert name not in presses.registry.PRESSES and name not in allocators.ALLOCATORS


def test_every_shipped_method_has_such_a_name():
    from runtime.options import METHOD_NAME

    assert all(METHOD_NAME.fullmatch(n) for n in [*presses.registry.PRESSES, *allocators.ALLOCATORS])

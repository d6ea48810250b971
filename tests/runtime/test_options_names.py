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


@pytest.mark.parametrize("registry", ["presses", "allocators"])
def test_a_name_too_long_for_a_folder_of_the_collection_is_refused_at_register(registry):
    """Probe 8, item 10: a press named with 300 characters was registered and ran, and only ``bench publish`` failed
    (a file name is at most 255 bytes). A name of METHOD_NAME_MAX characters is taken, one more is refused, naming
    the name, its length and the limit."""
    from runtime.options import METHOD_NAME_MAX

    module, base, kind, known = ((presses, SnapKVPress, "press", presses.registry.PRESSES) if registry == "presses"
                                 else (allocators, FlatAllocator, "allocator", allocators.ALLOCATORS))
    longest = "p" + "x" * (METHOD_NAME_MAX - 1)
    try:
        assert module.register(dataclasses.dataclass(type("Longest", (base,), {"name": longest}))).name == longest
    finally:
        known.pop(longest, None)  # the registry is the process's: other tests list it
    name = longest + "x"
    with pytest.raises(UsageError) as refusal:
        module.register(dataclasses.dataclass(type("Long", (base,), {"name": name})))
    assert str(refusal.value) == (f"Long.name 'pxxxxxxxxxxx...xxxxxxxxxxxxx' ({METHOD_NAME_MAX + 1} characters): "
                                  f"a {kind}'s name is at most {METHOD_NAME_MAX} characters, so that its results' "
                                  "folder can be named after it")
    assert name not in known


def test_every_shipped_method_has_such_a_name():
    from runtime.options import METHOD_NAME, METHOD_NAME_MAX

    assert all(METHOD_NAME.fullmatch(n) for n in [*presses.registry.PRESSES, *allocators.ALLOCATORS])
    assert max(map(len, [*presses.registry.PRESSES, *allocators.ALLOCATORS])) <= METHOD_NAME_MAX

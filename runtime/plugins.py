"""Presses and allocators from installed packages, found by name through the ecosystem's entry points.

A package declares its methods the way pytest plugins are declared::

    [project.entry-points."hybridpress.presses"]
    recency = "my_package.presses:RecencyPress"

    [project.entry-points."hybridpress.allocators"]
    halves = "my_package.budgets:HalvesAllocator"

Once it is installed, ``bench compare --methods recency/halves`` (and ``presses.get("recency")``) runs them: a name
the registry does not hold is looked up among the entry points of its group, and only that one is loaded. The entry
point names a class (registered under its own ``name``, which must be the entry point's) or a module that registers
its classes when imported.
"""

from __future__ import annotations

from importlib import metadata
from typing import Callable

from .errors import UsageError
from .user_imports import import_guarded

GROUPS = {"press": "hybridpress.presses", "allocator": "hybridpress.allocators"}
"""The entry-point group of each kind of method."""


def plugin_names(kind: str) -> list[str]:
    """The names installed packages declare for ``kind`` (``press`` or ``allocator``), sorted; nothing is loaded."""
    return sorted({point.name for point in metadata.entry_points(group=GROUPS[kind])})


def load_plugin(kind: str, name: str, registry: dict, register: Callable[[type], type]) -> None:
    """Register the ``kind`` that an installed package declares under ``name``, if one does and the registry does not
    hold it yet; a declaration that cannot be loaded, or that registers nothing under its name, is a
    :class:`~runtime.errors.UsageError` naming its package and what it points to."""
    if name in registry:
        return
    for point in metadata.entry_points(group=GROUPS[kind], name=name):
        package = point.dist.name if point.dist is not None else "an installed package"
        where = f"{kind} {name!r} of {package} ({GROUPS[kind]}: {name} = {point.value!r})"
        try:
            loaded = import_guarded(point.load, where)
        except UsageError:
            raise
        except Exception as error:  # noqa: BLE001 - any failure of the plugin's own import is the plugin's to fix
            raise UsageError(f"{where} cannot be loaded: {type(error).__name__}: {error}") from None
        if isinstance(loaded, type) and registry.get(name) is not loaded:
            if getattr(loaded, "name", None) != name:
                raise UsageError(f"{where} names the class {loaded.__name__}, whose name is "
                                 f"{getattr(loaded, 'name', None)!r}: the entry point's name and the class's must "
                                 "be one")
            register(loaded)
        if name not in registry:
            raise UsageError(f"{where} registered no {kind} of that name when loaded")
        return

"""The presses and allocators a group ``bench carry`` reruns names, each known here before any context is rerun.

A group whose press a user's module registers was run with ``--import MODULE``; carried without it, the rerun stopped
at an unknown press after the model had loaded (probe 15, U2).
"""

from __future__ import annotations

from pathlib import Path

from runtime.errors import UsageError
from runtime.plugins import plugin_names

from ..store.row_fields import BASELINE, method_of


def check_registered(rows: list[dict], where: Path) -> None:
    """``UsageError`` naming, with the store ``where``, the first press or allocator of ``rows``' methods that is
    neither registered (:func:`presses.register`, :func:`allocators.register`, a ``kvpress:`` class) nor declared by
    an installed package (:mod:`runtime.plugins`), and the ``--import`` flag that registers one of a user's module."""
    import allocators
    from presses import registry

    registries = {"press": registry.PRESSES, "allocator": allocators.ALLOCATORS}
    declared = {kind: set(plugin_names(kind)) for kind in registries}
    for row in {method_of(row): row for row in rows if row["press"] != BASELINE}.values():
        for kind, label in (("press", row["press"]), ("allocator", row["allocator"])):
            name = label.partition("(")[0]
            if name in registries[kind] or name in declared[kind] or (
                    kind == "press" and name.startswith(registry.KVPRESS_PREFIX)):
                continue
            article = "an" if kind == "allocator" else "a"
            raise UsageError(f"{where}: its group's method {method_of(row)} names the {kind} {name!r}, which is not "
                             f"registered here: {article} {kind} of your own module is registered by importing it, as "
                             "the run that wrote the group did: give that module with --import MODULE")

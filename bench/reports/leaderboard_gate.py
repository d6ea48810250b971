"""The CI leaderboard's gate: every press and allocator the project registers has rows in the default model's
published group, or the command that adds them is named.

A press or allocator that runs by its name alone (its defaults build it) is meant to be on the leaderboard: a new one
registered without its rows fails CI (``tests/bench/test_leaderboard_gate.py``), with the commands that add them
(CONTRIBUTING.md, "From a new press to its leaderboard row"). One that needs options to run at all (``perlayer``'s
weights, the ``kvpress`` bridge's class) is not.
"""

from __future__ import annotations

from collections.abc import Iterable

import allocators
import presses
from presses import registry

from ..store.row_fields import BASELINE

DEFAULT_GROUP = {"model": "hybrid-byte-12l", "length": 2048}
"""The default model's published group that the gate reads: its rows at 2,048 tokens."""
NOT_YET = {"adakv": "its rows join when the default model's group is rerun under the current shared code (the group's "
                    "rows are of an earlier code, and a carry reran other digits)",
           "head_shares": "it reads calibration/head_shares.json, which the default model does not ship yet (bench "
                          "calibrate-shares writes it); its rows join with the group's rerun"}
"""Methods meant for the group whose rows are not there yet, each with why: named, never silently skipped."""
COMMAND = ("bench compare --methods {method} --tasks niah --haystack generated --length 2048 --n 20 "
           "--keep-fractions 0.02,0.05,0.1,0.2,0.4,0.7 --out results/{name} && bench publish results/{name} "
           "--into docs/results && bench leaderboard docs/results --out docs")


def _builds(get, name: str) -> bool:
    try:
        get(name)
    except ValueError:  # an option it cannot run without
        return False
    return True


def meant() -> tuple[list[str], list[str]]:
    """``(presses, allocators)`` of the project's registries that run by their name alone."""
    own = [name for name, cls in registry.PRESSES.items() if cls.__module__.startswith("presses.")]
    return ([n for n in own if _builds(presses.get, n)],
            [n for n in allocators.ALLOCATORS if _builds(allocators.get, n)])


def missing(rows: Iterable[dict]) -> list[str]:
    """What the default model's group lacks, one line each with the command that adds it: every press
    (:func:`meant`) with some allocator, every allocator with some press, but those :data:`NOT_YET` names."""
    held = [r for r in rows if all(r.get(k) == v for k, v in DEFAULT_GROUP.items()) and r["press"] != BASELINE]
    have_presses = {r["press"].partition("(")[0] for r in held}
    have_allocators = {r["allocator"].partition("(")[0] for r in held}
    want_presses, want_allocators = meant()
    lines = []
    for kind, wanted, have, pair in (("press", want_presses, have_presses, "{}/flat"),
                                     ("allocator", want_allocators, have_allocators, "snapkv/{}")):
        for name in wanted:
            if name not in have and name not in NOT_YET:
                method = pair.format(name)
                lines.append(f"{kind} {name} has no rows in {DEFAULT_GROUP['model']}'s group at "
                             f"{DEFAULT_GROUP['length']} tokens; add them: "
                             + COMMAND.format(method=method, name=name))
    return lines

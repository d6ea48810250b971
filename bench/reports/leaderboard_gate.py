"""The CI leaderboard's gate: every press and allocator the project registers has rows in the default model's
published group, or the command that adds them is named.

A press or allocator that runs by its name alone (its defaults build it) is meant to be on the leaderboard: a new one
registered without its rows fails CI (``tests/bench/test_leaderboard_gate.py``), with the commands that add them
(CONTRIBUTING.md, "From a new press to its leaderboard row"). One that needs options to run at all (``perlayer``'s
weights, the ``kvpress`` bridge's class) is not. And the default model's groups are of the checkout's shared code
(:func:`stale`): an edit of the runtime carries them (``bench carry``), and an edit of one method reruns its rows,
so the leaderboard reproduces at main.
"""

from __future__ import annotations

from collections.abc import Iterable

import allocators
import presses
from presses import registry
from pretrained.model_spec import DEFAULT_MODEL_DIR

from ..store.code_version import code_version, method_codes
from ..store.collection import group_folder
from ..store.row_fields import BASELINE, METHOD_CODE

DEFAULT_GROUP = {"model": "hybrid-byte-12l", "length": 2048}
"""The default model's published group that the gate reads: its rows at 2,048 tokens."""
NOT_YET: dict[str, str] = {}
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


def stale(rows: Iterable[dict]) -> list[str]:
    """The default model's published groups whose shared code is not this checkout's, one line each with the
    command that carries them (``bench carry``): the leaderboard reproduces at the checkout, and a new method can
    join its groups, only while they are of its code."""
    rows = [r for r in rows if r["model"] == DEFAULT_GROUP["model"]]
    here = code_version()
    folders = {group_folder(r): r["code"] for r in rows if r["code"] != here}
    lines = [f"docs/results/{folder} is of shared code {code}, this checkout's is {here}: carry it (bench carry "
             f"docs/results/{folder}) or rerun it (scripts/full_sweep.sh)" for folder, code in sorted(folders.items())]
    return lines + _stale_methods(rows)


def _stale_methods(rows: list[dict]) -> list[str]:
    """The default model's published methods (those named without options) whose own code (``method_code``) is not
    this checkout's: an edit of a press or an allocator leaves its rows in their group, but they are of the old
    version, and a leaderboard that shows them as the method's is wrong until they are rerun."""
    published = {(r["press"], r["allocator"]): r.get(METHOD_CODE) for r in rows if r["press"] != BASELINE
                 and "(" not in r["press"] + r["allocator"]}
    pairs = sorted(published)
    here = dict(zip(pairs, method_codes([(presses.get(p), allocators.get(a)) for p, a in pairs], "hf",
                                        DEFAULT_MODEL_DIR)))
    return [f"{p}/{a}: its published rows are of its own code {published[p, a]}, this checkout's is {here[p, a]} (its "
            f"press or allocator was edited): rerun its rows ({COMMAND.format(method=f'{p}/{a}', name=p)}, after "
            "removing its folders from docs/results)" for p, a in pairs if published[p, a] != here[p, a]]


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

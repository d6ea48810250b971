"""Press registry: a new method is one file plus its class in this tuple."""

from __future__ import annotations

import dataclasses

from runtime.errors import UsageError
from runtime.options import (
    build_with_options,
    check_name,
    held_as,
    register_in,
    shown_value,
    typed_options,
)
from runtime.plugins import load_plugin, plugin_names

from .base import Press
from .gatesight import GateSightPress
from .keydiff import KeyDiffPress
from .kvpress_adapter import KvpressScorer
from .kvpress_names import NAMES, kvpress_object
from .kvpress_wrappers import refusal
from .kvzip import KVzipPress
from .snapkv import SnapKVPress
from .triattention import TriAttentionPress

PRESSES: dict[str, type[Press]] = {
    cls.name: cls for cls in (GateSightPress, SnapKVPress, TriAttentionPress, KeyDiffPress, KVzipPress, KvpressScorer)
}


KVPRESS_PREFIX = "kvpress:"


def register(cls: type[Press]) -> type[Press]:
    """Add a press class to the registry under its ``name`` (a class decorator): a press of one's own, in one's
    own module, runs wherever a registry name does (``bench compare``, ``bench cost``, the pipelines).

    Raises
    ------
    UsageError
        A class that is not a :class:`Press`, without a ``name``, or whose name is taken by another class.
    """
    return register_in(PRESSES, cls, Press, "press", reserved_prefix=KVPRESS_PREFIX)


def available() -> list[str]:
    """The presses a name may give: the registry's, then those installed packages declare (:mod:`runtime.plugins`)."""
    listed = [f"{KVPRESS_PREFIX}<ScorerPress class or kvpress short name>" if name == KvpressScorer.name else name
              for name in PRESSES]
    return listed + [name for name in plugin_names("press") if name not in PRESSES]


def _kvpress_scorer(name: str, options: dict):
    """The kvpress ``ScorerPress`` a ``kvpress:`` name names — a class (``KnormPress``) or one of kvpress's short
    names (``knorm``: :mod:`presses.kvpress_names`) — with ``options`` (its fields, typed). A short name of a
    wrapper is refused: the allocator it maps to is chosen with the allocator, not the press."""
    if name not in NAMES:
        return KvpressScorer.build(name, **options)
    import kvpress

    press = kvpress_object(name)
    if isinstance(press, kvpress.AdaKVPress):
        inner = type(press.press).__name__
        raise UsageError(f"{KVPRESS_PREFIX}{name} is AdaKVPress({inner}()): a press here is the scorer alone; "
                         f"name it with the adakv allocator ({KVPRESS_PREFIX}{inner}, allocator adakv)")
    if not isinstance(press, kvpress.ScorerPress):
        raise UsageError(refusal(press))
    if not options:  # as built: replace() would rebuild it, which some presses' own fields do not allow
        return press
    return dataclasses.replace(press, **typed_options(type(press), f"{KVPRESS_PREFIX}{name}", options,
                                                      KVPRESS_RESERVED))


KVPRESS_RESERVED = {"compression_ratio": "kvpress's budget, which the run sets for every method (keep_fraction or "
                                        "compression_ratio where the press is used, --keep-fractions on the "
                                        "command line): leave it out"}
"""The fields of a kvpress scorer that are not its options here, and why."""


RUN_SETS = {KVzipPress.name: {"tokenizer": "the model's own, which the run hands the press (a library call may give "
                                          "one: presses.get('kvzip', tokenizer=...)): leave it out"}}
"""Fields of a press that a run sets itself, so that no run's options give them (probe 24, #3: ``tokenizer=x`` was
taken as text and failed after the model loaded), and why; the press's own module is unchanged, and so is its code."""


def check_library_name(name) -> None:
    """Refuse a press name the library cannot take (not text; bench compare's bracket options) before any look-up
    (:func:`runtime.options.check_name`), ``kvpress:`` names included."""
    check_name(name, PRESSES, Press, "--press", "presses.get", available(), open_prefix=KVPRESS_PREFIX)


def get(name: str, **kwargs) -> Press:
    """A press by registry name, or ``kvpress:<ClassName>`` for any kvpress ``ScorerPress`` (built with its
    defaults), its options typed by their fields (:mod:`runtime.options`: ``"no"`` for a boolean is False);
    a name that is not text, unknown names and options, and ill-typed values raise a
    :class:`~runtime.errors.UsageError` saying what is allowed."""
    check_library_name(name)
    load_plugin("press", name, PRESSES, register)
    if name.startswith(KVPRESS_PREFIX):
        return KvpressScorer(press=_kvpress_scorer(name.removeprefix(KVPRESS_PREFIX), kwargs))
    if name == KvpressScorer.name and "press" not in kwargs:
        raise UsageError(f"name the kvpress scorer to wrap: {KVPRESS_PREFIX}<ClassName>, "
                         f"e.g. {KVPRESS_PREFIX}KnormPress")
    if name not in PRESSES:
        raise UsageError(f"unknown press {name!r}; available: {', '.join(available())}")
    return build_with_options(PRESSES[name], name, kwargs, "press")


def options_of(name: str, options: dict) -> dict:
    """``options`` of the press ``name`` typed by its fields, as :func:`get` builds it with them (``ValueError``
    as :func:`get`'s): what a run records, so that ``normalized_anchor=no`` and ``=false`` name one setting."""
    if name.startswith(KVPRESS_PREFIX):
        short = name.removeprefix(KVPRESS_PREFIX)
        cls = type(_kvpress_scorer(short, {})) if short in NAMES else KvpressScorer.scorer_class(short)
        return typed_options(cls, name, options, KVPRESS_RESERVED)
    if name in PRESSES:  # before the build, which takes them from a library call
        typed_options(PRESSES[name], name, options, RUN_SETS.get(name))
    built = get(name, **options)  # unknown names and the bare "kvpress" fail as get's do
    typed = typed_options(PRESSES[name], name, options)
    files = PRESSES[name].artifact_files  # an artifact option holds what it read from the folder
    for key in typed.keys() - files.keys():
        held = getattr(built, key)
        if not shown_value(held):  # probe 23, #2: a traceback comparing two settings that hold arrays
            raise UsageError(f"press {name}: built, it holds {key} as {held_as(held)}, which no "
                             "label shows: have its __post_init__ keep a number, a text, or a list of numbers")
    return typed

"""Press registry: a new method is one file plus its class in this tuple."""

from __future__ import annotations

from allocators.options import build_with_options, typed_options

from .base import Press
from .gatesight import GateSightPress
from .keydiff import KeyDiffPress
from .kvpress_adapter import KvpressScorer
from .kvzip import KVzipPress
from .snapkv import SnapKVPress
from .triattention import TriAttentionPress

PRESSES: dict[str, type[Press]] = {
    cls.name: cls for cls in (GateSightPress, SnapKVPress, TriAttentionPress, KeyDiffPress, KVzipPress, KvpressScorer)
}


KVPRESS_PREFIX = "kvpress:"


def available() -> list[str]:
    return [f"{KVPRESS_PREFIX}<ScorerPress class>" if name == KvpressScorer.name else name for name in PRESSES]


def get(name: str, **kwargs) -> Press:
    """A press by registry name, or ``kvpress:<ClassName>`` for any kvpress ``ScorerPress`` (built with its
    defaults), its options typed by their fields (:mod:`allocators.options`: ``"no"`` for a boolean is False);
    unknown names and options, and ill-typed values, raise ``ValueError`` saying what is allowed."""
    if name.startswith(KVPRESS_PREFIX):
        return KvpressScorer(press=KvpressScorer.build(name.removeprefix(KVPRESS_PREFIX), **kwargs))
    if name == KvpressScorer.name and "press" not in kwargs:
        raise ValueError(f"name the kvpress scorer to wrap: {KVPRESS_PREFIX}<ClassName>, e.g. {KVPRESS_PREFIX}KnormPress")
    if name not in PRESSES:
        raise ValueError(f"unknown press {name!r}; available: {', '.join(available())}")
    return build_with_options(PRESSES[name], name, kwargs)


def options_of(name: str, options: dict) -> dict:
    """``options`` of the press ``name`` typed by its fields, as :func:`get` builds it with them (``ValueError``
    as :func:`get`'s): what a run records, so that ``normalized_anchor=no`` and ``=false`` name one setting."""
    if name.startswith(KVPRESS_PREFIX):
        class_name = name.removeprefix(KVPRESS_PREFIX)
        return typed_options(KvpressScorer.scorer_class(class_name), name, options)
    get(name, **options)  # unknown names and the bare "kvpress" fail as get's do
    return typed_options(PRESSES[name], name, options)

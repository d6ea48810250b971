"""Press registry: a new method is one file plus its class in this tuple."""

from __future__ import annotations

from dataclasses import fields

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
    defaults); unknown names raise ``ValueError`` listing the valid ones."""
    if name.startswith(KVPRESS_PREFIX):
        return KvpressScorer(press=KvpressScorer.build(name.removeprefix(KVPRESS_PREFIX), **kwargs))
    if name == KvpressScorer.name and "press" not in kwargs:
        raise ValueError(f"name the kvpress scorer to wrap: {KVPRESS_PREFIX}<ClassName>, e.g. {KVPRESS_PREFIX}KnormPress")
    if name not in PRESSES:
        raise ValueError(f"unknown press {name!r}; available: {', '.join(available())}")
    return build_with_options(PRESSES[name], name, kwargs)


def build_with_options(cls, name: str, options: dict):
    """``cls(**options)``; an unknown option is a ``ValueError`` that names the valid ones."""
    valid = [f.name for f in fields(cls) if f.init]
    unknown = [key for key in options if key not in valid]
    if unknown:
        raise ValueError(f"{name} has no option {unknown[0]!r}; valid: {', '.join(valid) or 'none'}")
    try:
        return cls(**options)
    except TypeError as error:  # a required field without a default, e.g. a wrapper's inner press
        raise ValueError(f"{name} cannot be built from these options: {error}") from None

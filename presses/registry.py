"""Press registry: a new method is one file plus one line here."""

from __future__ import annotations

from .base import Press
from .gatesight import GateSightPress
from .keydiff import KeyDiffPress
from .kvpress_adapter import KvpressScorer
from .kvzip import KVzipPress
from .snapkv import SnapKVPress
from .triattention import TriAttentionPress

PRESSES: dict[str, type[Press]] = {
    "gatesight": GateSightPress,
    "snapkv": SnapKVPress,
    "triattention": TriAttentionPress,
    "keydiff": KeyDiffPress,
    "kvzip": KVzipPress,
    "kvpress": KvpressScorer,
}


def available() -> list[str]:
    return list(PRESSES)


def get(name: str, **kwargs) -> Press:
    """A press by registry name; unknown names raise ``ValueError`` listing the valid ones."""
    if name not in PRESSES:
        raise ValueError(f"unknown press {name!r}; available: {', '.join(PRESSES)}")
    return PRESSES[name](**kwargs)

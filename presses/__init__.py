"""What to keep: one file per scorer, a registry, and the shared selection."""

from __future__ import annotations

from .base import Press, Scores
from .gatesight import GateSightEstimator, GateSightPress
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


from .compress import compress  # noqa: E402  (compress resolves names through this registry)

__all__ = ["GateSightEstimator", "PRESSES", "Press", "Scores", "available", "compress", "get"]

"""KeyDiff (arXiv 2504.15364): keep the keys least similar to the mean key of their head."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import Press, Scores, ScoringContext


def keydiff_scores(keys: torch.Tensor, normalized_anchor: bool) -> torch.Tensor:
    """``[..., n, d]`` keys -> ``[..., n]`` negative cosine to the head's mean (of normalised keys if asked)."""
    anchor = (F.normalize(keys, dim=-1) if normalized_anchor else keys).mean(dim=-2, keepdim=True)
    return -F.cosine_similarity(keys, anchor, dim=-1)


@dataclass
class KeyDiffPress(Press):
    """Negative cosine of each cached (post-RoPE) body key to its head's mean body key.

    Parameters
    ----------
    normalized_anchor : bool
        ``False`` (paper App. G): plain mean of the keys. ``True``: mean of unit keys, as ``kvpress.KeyDiffPress``.
    """

    normalized_anchor: bool = False
    name = "keydiff"
    runs_in_engine = True

    def score(self, context: ScoringContext) -> Scores:
        return {
            layer: keydiff_scores(context.kv[layer].keys[:, context.protected :].float(), self.normalized_anchor)
            for layer in context.adapter.attention_layers
        }

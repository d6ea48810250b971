"""SnapKV, query-agnostic (arXiv 2404.14469; paper App. G): the last w context tokens observe the cache."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from runtime import EvidenceRequest
from runtime.errors import UsageError
from runtime.explicit_attention import attention_probs

from .base import Press, Scores, ScoringContext, group_reduce


@dataclass
class SnapKVPress(Press):
    """Attention of the observation window (its queries recomputed with q-norm and partial RoPE), summed over
    the window, GQA-aggregated, max-pooled. The window's own entries get the maximum score (always kept first).

    Parameters
    ----------
    window : int
        Observation window w (last context tokens).
    kernel : int
        Max-pool kernel (odd).
    gqa : str
        ``"mean"`` or ``"max"`` over each KV head's query heads.
    """

    window: int = 32
    kernel: int = 7
    gqa: str = "mean"
    name = "snapkv"
    runs_in_engine = True

    def __post_init__(self):
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise UsageError(f"window={self.window!r}: expected an integer >= 1 (last context tokens)")
        if isinstance(self.kernel, bool) or not isinstance(self.kernel, int) or self.kernel < 1 or self.kernel % 2 == 0:
            raise UsageError(f"kernel={self.kernel!r}: expected an odd integer >= 1 (max-pool width)")
        if self.gqa not in ("mean", "max"):
            raise UsageError(f"gqa={self.gqa!r}: choose 'mean' or 'max'")

    def evidence(self, adapter) -> EvidenceRequest:
        return EvidenceRequest(window=self.window)

    def observation_window(self, context: ScoringContext) -> int:
        """w: the recorded window, shortened so that at least one body entry lies before it."""
        layer = context.adapter.attention_layers[0]
        if layer not in context.evidence.window_hidden:
            raise ValueError("SnapKV reads the last window's layer inputs recorded at prefill: prefill with "
                             "evidence=press.evidence(adapter)")
        n_body = context.n - context.protected
        if n_body < 2:
            raise ValueError(f"SnapKV needs at least 2 body tokens (n - protected), got {n_body}")
        return min(self.window, context.evidence.window_hidden[layer].shape[0], n_body - 1)

    def window_attention(self, context: ScoringContext, layer: int, w: int) -> torch.Tensor:
        """``[H, w, n]`` float32 softmax of the last ``w`` context queries over all n keys (causal in the window)."""
        adapter, n = context.adapter, context.n
        hidden = context.evidence.window_hidden[layer][-w:]
        positions = torch.arange(n - w, n, device=hidden.device)
        cos, sin = adapter.rope(hidden, positions)
        query = adapter.queries(layer, hidden[None], cos, sin)
        scaling = adapter.attention_module(layer).scaling
        return attention_probs(query.float(), context.kv[layer].keys.float(), scaling, causal_tail=w)

    def score(self, context: ScoringContext) -> Scores:
        scores = {}
        w = self.observation_window(context)
        for layer in context.adapter.attention_layers:
            votes = self.window_attention(context, layer, w).sum(1)[:, : context.n - w]
            votes = group_reduce(votes, context.adapter.geometry.group_size, self.gqa)
            pooled = F.max_pool1d(votes[None], self.kernel, stride=1, padding=self.kernel // 2)[0]
            full = torch.cat([pooled, pooled.new_full((pooled.shape[0], w), float(pooled.max()))], dim=1)
            scores[layer] = full[:, context.protected :]
        return scores

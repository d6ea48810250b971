"""Run any ``kvpress`` ``ScorerPress`` as a press on this harness, hybrids included.

kvpress hooks ``layer.self_attn`` of every layer, which breaks on GDN layers; here the scorer is only handed what
it reads — the attention module, the layer's input hidden states, and the cached keys and values — per attention
layer. Presses that rebuild queries through kvpress's own helper inherit its Qwen3.5 limitations (gated
``q_proj``, partial RoPE); key- and value-based presses are exact.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime import EvidenceRequest, Parent

from .base import Press, Scores

ALL_TOKENS = 1 << 40


@dataclass
class KvpressScorer(Press):
    """Parameters: ``press``, a ``kvpress.ScorerPress`` instance (its ``compression_ratio`` is ignored: budgets
    come from the allocator)."""

    press: object = None
    name = "kvpress"

    @staticmethod
    def build(class_name: str, **options):
        """A kvpress ``ScorerPress`` subclass by class name, with ``options`` (its dataclass fields)."""
        import kvpress

        cls = getattr(kvpress, class_name, None)
        if not (isinstance(cls, type) and issubclass(cls, kvpress.ScorerPress)):
            names = sorted(n for n in dir(kvpress) if isinstance(getattr(kvpress, n), type)
                           and issubclass(getattr(kvpress, n), kvpress.ScorerPress))
            raise ValueError(f"{class_name!r} is not a kvpress ScorerPress; available: {', '.join(names)}")
        from .registry import build_with_options

        return build_with_options(cls, f"kvpress:{class_name}", options)

    def evidence(self, adapter) -> EvidenceRequest:
        return EvidenceRequest(window=ALL_TOKENS)

    def check(self, adapter) -> None:
        from kvpress import ScorerPress

        if not isinstance(self.press, ScorerPress):
            raise ValueError(f"KvpressScorer wraps a kvpress ScorerPress, got {type(self.press).__name__}")

    def score(self, parent: Parent) -> Scores:
        self.check(parent.adapter)
        scores = {}
        for layer in parent.adapter.attention_layers:
            kv = parent.kv[layer]
            hidden = parent.evidence.window_hidden[layer][None]
            per_entry = self.press.score(
                parent.adapter.attention_module(layer), hidden, kv.keys[None], kv.values[None], None, {}
            )
            scores[layer] = per_entry[0, :, parent.protected :].float()
        return scores

"""Run any ``kvpress`` ``ScorerPress`` as a press on this harness, hybrids included.

kvpress hooks ``layer.self_attn`` of every layer, which breaks on GDN layers. Here each attention layer's scorer
is called the way kvpress's own forward hook calls it after a prefill: ``post_init_from_model`` once per model,
``module.rotary_emb`` set, the layer's input hidden states of the whole context, the cached keys and values
``[1, H_kv, n, d]``, the context's attention weights where the press reads them, and the keyword arguments
kvpress reads (``position_embeddings`` of positions 0 … n − 1, ``cache_position``, ``hidden_states``).

Qwen3.5's attention emits its output gate from ``q_proj`` and rotates only part of each head (partial RoPE);
kvpress's query helper cannot handle either. For such models the press sees a view of the attention module whose
``q_proj`` returns the runtime's own post-norm, post-RoPE queries, with identity ``position_embeddings``: the
queries a press computes are then exactly the model's. Presses that rebuild RoPE for future positions through
``module.rotary_emb`` are refused on partial-RoPE models; presses that download per-model artifacts from the
hub (this project runs offline) or whose scores depend on the compression ratio (budgets come from the allocator,
after scoring) are refused everywhere, each with its reason, when the press is built.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from runtime import EvidenceRequest
from runtime.errors import UsageError
from runtime.kv import attention_probs
from runtime.options import build_with_options

from .base import Press, Scores, ScoringContext

ALL_TOKENS = 1 << 40
NEEDS_ATTENTIONS = ("ObservedAttentionPress",)
"""Presses that read the context's attention weights (kvpress: ``attn_implementation="eager"``)."""
OFFLINE_REFUSALS = {
    "QFilterPress": "it downloads per-model Q-filters from the Hugging Face hub (nthngdy/<model>_qfilt)",
    "KVzapPress": "it downloads a per-model surrogate from the Hugging Face hub (nvidia/KVzap-<type>-<model>)",
    "ExpectedAttentionStatsPress": "it downloads per-model query statistics from the Hugging Face hub",
}
RATIO_DEPENDENT = {
    "StreamingLLMPress": "its scores are not a ranking but the keep mask of one compression ratio (sinks, then the "
                         "tokens after them evicted): here budgets come from the allocator after scoring",
    "CriticalKVPress": "its scores depend on the compression ratio (a budget-dependent two-stage selection): here "
                       "budgets come from the allocator after scoring",
}
FULL_ROPE_ONLY = ("ExpectedAttentionPress", "CapPress")
"""Presses that rebuild RoPE for future positions with ``module.rotary_emb`` over the full head dimension."""


def scorer_names() -> list[str]:
    """kvpress's ``ScorerPress`` subclasses that score (the abstract base left out)."""
    import kvpress

    classes = {name: getattr(kvpress, name) for name in dir(kvpress)}
    return sorted(name for name, cls in classes.items() if isinstance(cls, type)
                  and issubclass(cls, kvpress.ScorerPress) and cls is not kvpress.ScorerPress)


def _refusal(press) -> str | None:
    for cls in type(press).__mro__:
        reason = OFFLINE_REFUSALS.get(cls.__name__) or RATIO_DEPENDENT.get(cls.__name__)
        if reason:
            return f"kvpress {type(press).__name__} cannot run here: {reason}"
    inner = getattr(press, "press", None)  # wrappers (CriticalKVPress) carry the press they score with
    return _refusal(inner) if inner is not None else None


class _QueryView(nn.Module):
    """The attention module as kvpress's query helper expects it, for a gated, partial-RoPE attention: ``q_proj``
    maps a contiguous slice of the context's layer inputs to the runtime's post-RoPE queries ``[1, L, H·d]``."""

    def __init__(self, module: nn.Module, hidden: torch.Tensor, queries: torch.Tensor):
        super().__init__()
        self.inner = module
        self.hidden, self.queries = hidden, queries  # [1, n, D] and [1, n, H·d]
        self.config, self.head_dim, self.layer_idx = module.config, module.head_dim, module.layer_idx
        self.scaling = module.scaling

    def q_proj(self, hidden: torch.Tensor) -> torch.Tensor:
        length, n = hidden.shape[1], self.hidden.shape[1]
        # the slice's start: the suffix (window presses) or wherever its rows are (chunked presses)
        candidates = [n - length] + (self.hidden[0] == hidden[0, :1]).all(-1).nonzero()[:, 0].tolist()
        for start in candidates:
            if 0 <= start <= n - length and torch.equal(hidden, self.hidden[:, start : start + length]):
                return self.queries[:, start : start + length]
        raise ValueError("this kvpress press asked for queries of tokens that are not a slice of the context")

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["inner"], name)


@dataclass
class KvpressScorer(Press):
    """Parameters: ``press``, a ``kvpress.ScorerPress`` instance (its ``compression_ratio`` is ignored: budgets
    come from the allocator)."""

    press: object = None
    name = "kvpress"

    def __post_init__(self):
        from kvpress import ScorerPress

        if not isinstance(self.press, ScorerPress):
            raise UsageError(f"KvpressScorer wraps a kvpress ScorerPress, got {type(self.press).__name__}")
        reason = _refusal(self.press)
        if reason:
            raise UsageError(reason)
        self._initialised_for = None

    @staticmethod
    def scorer_class(class_name: str) -> type:
        """The kvpress ``ScorerPress`` subclass named ``class_name``; ``ValueError`` listing them otherwise."""
        import kvpress

        cls = getattr(kvpress, class_name, None)
        if cls is kvpress.ScorerPress:
            raise UsageError(f"kvpress:{class_name} is the abstract base of kvpress's scorers (its score() is not "
                             f"implemented); name one of them: {', '.join(scorer_names())}")
        if not (isinstance(cls, type) and issubclass(cls, kvpress.ScorerPress)):
            raise UsageError(f"{class_name!r} is not a kvpress ScorerPress; available: {', '.join(scorer_names())}; "
                             "or one of kvpress's short names (knorm, snapkv, …: presses.kvpress_names)")
        return cls

    @staticmethod
    def build(class_name: str, **options):
        """A kvpress ``ScorerPress`` subclass by class name, with ``options`` (its dataclass fields, typed)."""
        return build_with_options(KvpressScorer.scorer_class(class_name), f"kvpress:{class_name}", options)

    def evidence(self, adapter) -> EvidenceRequest:
        return EvidenceRequest(window=ALL_TOKENS)

    def check(self, adapter) -> None:
        partial = adapter.geometry.rotary_dim < adapter.geometry.head_dim
        if partial and any(c.__name__ in FULL_ROPE_ONLY for c in type(self.press).__mro__):
            raise UsageError(f"kvpress {type(self.press).__name__} rebuilds RoPE over the full head dimension; "
                             f"{type(adapter.model).__name__} rotates {adapter.geometry.rotary_dim} of "
                             f"{adapter.geometry.head_dim} dimensions (partial RoPE)")

    def score(self, context: ScoringContext) -> Scores:
        adapter = context.adapter
        self.check(adapter)
        model = adapter.model
        if self._initialised_for is not model:
            self.press.post_init_from_model(model)
            self._initialised_for = model
        positions = torch.arange(context.n, device=adapter.device)
        any_hidden = context.evidence.window_hidden[adapter.attention_layers[0]]
        if any_hidden.shape[0] != context.n:
            raise UsageError("kvpress presses read every context token's layer input: prefill with "
                             "evidence=press.evidence(adapter)")
        cos, sin = model.model.rotary_emb(any_hidden[None], positions[None])
        scores = {}
        for layer in adapter.attention_layers:
            module = adapter.attention_module(layer)
            module.rotary_emb = model.model.rotary_emb  # what kvpress's context manager sets on every layer
            kv = context.kv[layer]
            hidden = context.evidence.window_hidden[layer][None]
            queries = None
            if adapter.gated or adapter.geometry.rotary_dim < adapter.geometry.head_dim:
                queries = adapter.queries(layer, hidden, cos[0], sin[0])  # [H, n, d], post-RoPE
                module = _QueryView(module, hidden, queries.transpose(0, 1).reshape(1, context.n, -1))
                identity = torch.ones(1, context.n, adapter.geometry.head_dim, dtype=queries.dtype,
                                      device=queries.device)
                embeddings = (identity, torch.zeros_like(identity))  # the view's queries are rotated already
            else:
                embeddings = (cos, sin)
            attentions = None
            if any(c.__name__ in NEEDS_ATTENTIONS for c in type(self.press).__mro__):
                if queries is None:
                    queries = adapter.queries(layer, hidden, cos[0], sin[0])
                attentions = attention_probs(queries.float(), kv.keys.float(), module.scaling,
                                             causal_tail=context.n).to(kv.keys.dtype)[None]
            kwargs = {"hidden_states": hidden, "position_embeddings": embeddings, "cache_position": positions,
                      "attention_mask": None}
            per_entry = self.press.score(module, hidden, kv.keys[None], kv.values[None], attentions, kwargs)
            scores[layer] = per_entry[0, :, context.protected :].float()
        return scores

"""Run any ``kvpress`` ``ScorerPress`` as a press on this harness, hybrids included.

kvpress hooks ``layer.self_attn`` of every layer, which breaks on GDN layers. Here each attention layer's scorer
is called the way kvpress's own forward hook calls it after a prefill: ``post_init_from_model`` once per model,
``module.rotary_emb`` set, the layer's input hidden states ``[1, n, D]`` of the whole context, the cached keys and
values ``[1, H_kv, n, d]``, the context's attention weights where the press reads them, and the keyword arguments
kvpress reads (``position_embeddings`` of positions 0 … n − 1, ``cache_position``, ``hidden_states``).

The prefill records of those layer inputs only the rows the scorer reads (:func:`rows_read`): none for the
key-only scorers, the last ``window_size`` for SnapKV; at scoring, one layer at a time, the recorded rows end an
``[1, n, D]`` tensor whose other rows (never read) are zeros.

Qwen3.5's attention emits its output gate from ``q_proj`` and rotates only part of each head (partial RoPE);
kvpress's query helper cannot handle either. For such models the press sees a view of the attention module whose
``q_proj`` returns the runtime's own post-norm, post-RoPE queries, with identity ``position_embeddings``: the
queries a press computes are then exactly the model's. Presses that rebuild RoPE for future positions through
``module.rotary_emb`` are refused on partial-RoPE models; presses that download per-model artifacts from the
hub (this project runs offline) or whose scores depend on the compression ratio (budgets come from the allocator,
after scoring) are refused everywhere, each with its reason, when the press is built.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn

from runtime import EvidenceRequest
from runtime.errors import UsageError
from runtime.explicit_attention import attention_probs
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
ROWS_READ = {
    "CURPress": (("score",), 0),
    "KeyDiffPress": (("score",), 0),
    "KnormPress": (("score",), 0),
    "LagKVPress": (("score",), 0),
    "RandomPress": (("score",), 0),
    "SnapKVPress": (("score", "compute_window_attention"), "window_size"),
    "TOVAPress": (("score",), 1),
}
"""How many of the context's last layer inputs (rows of ``hidden_states``) kvpress 0.5.5's scorers read: the
methods ``hidden_states`` reaches, and the row count (an int, or the press field that holds it). The key-only
scorers read none (their scores are functions of the keys and values); SnapKV's queries are the last
``window_size`` rows (``hidden_states[:, -window_size:]`` in ``compute_window_attention``, whose length it
asserts), TOVA's the last one (``compute_window_attention(..., 1, ...)``). A press, subclasses included
(PyramidKVPress scores with SnapKV's methods), gets the count only while those methods are the listed class's
own: one that overrides any of them, and any press not listed, reads every row (:data:`ALL_TOKENS`)."""
SIZES = {"window_size": 1, "kernel_size": 1, "local_window_size": 1, "lag_size": 1, "chunk_size": 1,
         "sketch_dimension": 1, "beta": 1, "n_future_positions": 1, "n_sink": 0, "num_sinks": 0,
         "sink_size_start": 0, "sink_size_end": 0}
"""The integer fields of kvpress 0.5.5's scorers that count tokens, rows or dimensions, and their least value
(sinks may be none; a window, kernel, chunk or sketch of no rows slices, pools or projects nothing, and a negative
one slices from the start): kvpress checks none of them and fails deep in its scoring instead."""
ODD = ("kernel_size",)
"""Fields kvpress pools with ``padding = size // 2`` at stride 1: an even size returns one score too many."""


def check_fields(press) -> None:
    """``UsageError`` naming the first field of :data:`SIZES` that ``press`` (a kvpress press) holds out of range,
    before anything is loaded or prefilled."""
    for field, least in SIZES.items():
        if not hasattr(press, field):
            continue
        value = getattr(press, field)
        allowed = f"an integer >= {least}" + (", odd (kvpress pools with padding size // 2)" if field in ODD else "")
        if isinstance(value, bool) or not isinstance(value, int) or value < least or (field in ODD and value % 2 == 0):
            raise UsageError(f"kvpress {type(press).__name__} {field}={value!r}: expected {allowed}")


def scorer_names() -> list[str]:
    """kvpress's ``ScorerPress`` subclasses that score (the abstract base left out)."""
    import kvpress

    classes = {name: getattr(kvpress, name) for name in dir(kvpress)}
    return sorted(name for name, cls in classes.items() if isinstance(cls, type)
                  and issubclass(cls, kvpress.ScorerPress) and cls is not kvpress.ScorerPress)


def rows_read(press) -> int:
    """How many of the context's last layer inputs ``press`` (a kvpress ``ScorerPress``) reads: :data:`ROWS_READ`,
    or :data:`ALL_TOKENS` where its scoring is not one listed there or reads attention weights (their queries are
    every token's)."""
    import kvpress

    if any(c.__name__ in NEEDS_ATTENTIONS for c in type(press).__mro__):
        return ALL_TOKENS
    for name, (methods, rows) in ROWS_READ.items():
        cls = getattr(kvpress, name)
        # bound methods compare by their function: an override, on the class or the instance, is another function
        if isinstance(press, cls) and all(getattr(getattr(press, m), "__func__", getattr(press, m))
                                          is getattr(cls, m) for m in methods):
            if isinstance(rows, int):
                return rows
            count = getattr(press, rows)
            # kvpress slices hidden_states[:, -count:]: a count below 1 slices from the start (every row)
            return count if isinstance(count, int) and count >= 1 else ALL_TOKENS
    return ALL_TOKENS


def _layer_inputs(recorded: torch.Tensor | None, n: int, width: int, dtype: torch.dtype,
                  device: torch.device) -> torch.Tensor:
    """``[1, n, D]`` layer inputs as a scorer sees them: the ``[w, D]`` ``recorded`` for the last ``w`` context
    tokens at the end, zeros before (rows the scorer never reads); with nothing recorded, a zero tensor that holds
    no memory (a scorer that reads no row still gets the context's length)."""
    if recorded is None:
        return torch.zeros((), dtype=dtype, device=device).expand(1, n, width)
    if recorded.shape[0] == n:
        return recorded[None]
    hidden = recorded.new_zeros(n, width)
    hidden[n - recorded.shape[0] :] = recorded
    return hidden[None]


def _class_refusal(cls: type) -> str | None:
    """Why presses of the kvpress class ``cls`` cannot run here (along its bases), or None."""
    for base in cls.__mro__:
        reason = OFFLINE_REFUSALS.get(base.__name__) or RATIO_DEPENDENT.get(base.__name__)
        if reason:
            return f"kvpress {cls.__name__} cannot run here: {reason}"
    return None


def _refusal(press) -> str | None:
    reason = _class_refusal(type(press))
    if reason:
        return reason
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
        check_fields(self.press)
        self._initialised_for = None

    def code_objects(self) -> tuple[type, ...]:
        """kvpress's scorer class: its code (at kvpress's version) decides the scores."""
        return (type(self.press),)

    @property
    def shown_name(self) -> str:
        return f"kvpress:{type(self.press).__name__}"

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
        """A kvpress ``ScorerPress`` subclass by class name, with ``options`` (its dataclass fields, typed); a
        wrapper of another press (``CriticalKVPress(press)``), which options cannot give, is refused saying so."""
        import kvpress

        cls = KvpressScorer.scorer_class(class_name)
        wrapped = [p.name for p in inspect.signature(cls).parameters.values() if p.default is p.empty
                   and isinstance(p.annotation, type) and issubclass(p.annotation, kvpress.BasePress)]
        if wrapped:
            reason = _class_refusal(cls)
            anyway = f" (nor could it run: {reason.split(': ', 1)[1]})" if reason else ""
            raise UsageError(f"kvpress:{class_name} wraps another press (its argument {wrapped[0]!r}), which options "
                             f"here cannot give{anyway}. The kvpress wrappers that run here are budget rules: "
                             "AdaKVPress, PerLayerCompressionPress and PyramidKVPress, as the allocators adakv, "
                             "perlayer and pyramid with the press they wrap (kvpress:<Class> with --alloc), or as "
                             "kvpress press objects in the library")
        return build_with_options(cls, f"kvpress:{class_name}", options, "press")

    def evidence(self, adapter) -> EvidenceRequest:
        return EvidenceRequest(window=rows_read(self.press))

    def check_context(self, n: int) -> None:
        window = getattr(self.press, "window_size", None)
        if window is not None and rows_read(self.press) != ALL_TOKENS and window >= n:
            # kvpress's window queries score the keys before the window: it asserts n > window_size
            raise UsageError(f"kvpress {type(self.press).__name__} window_size={window}: expected below the "
                             f"context's length, {n} tokens here (its window scores the keys before it)")

    def check(self, adapter) -> None:
        partial = adapter.geometry.rotary_dim < adapter.geometry.head_dim
        if partial and any(c.__name__ in FULL_ROPE_ONLY for c in type(self.press).__mro__):
            raise UsageError(f"kvpress {type(self.press).__name__} rebuilds RoPE over the full head dimension; "
                             f"{type(adapter.model).__name__} rotates {adapter.geometry.rotary_dim} of "
                             f"{adapter.geometry.head_dim} dimensions (partial RoPE)")

    def score(self, context: ScoringContext) -> Scores:
        adapter = context.adapter
        self.check(adapter)
        self.check_context(context.n)
        model = adapter.model
        if self._initialised_for is not model:
            self.press.post_init_from_model(model)
            self._initialised_for = model
        rows, recorded = min(rows_read(self.press), context.n), context.evidence.window_hidden
        held = min((recorded[layer].shape[0] if layer in recorded else 0) for layer in adapter.attention_layers)
        if held < rows:
            raise UsageError(f"kvpress {type(self.press).__name__} reads the layer inputs of the last {rows} of the "
                             f"{context.n} context tokens; the prefill recorded {held}: prefill with "
                             "evidence=press.evidence(adapter)")
        positions = torch.arange(context.n, device=adapter.device)
        cos, sin = adapter.rope(torch.empty(0, dtype=adapter.dtype, device=adapter.device), positions)  # [n, r]
        return {layer: self._score_layer(context, layer, cos, sin) for layer in adapter.attention_layers}

    def _score_layer(self, context: ScoringContext, layer: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``[H_kv, n_body]`` scores of one attention layer; its ``[1, n, D]`` layer inputs live only in this call."""
        adapter = context.adapter
        module = adapter.attention_module(layer)
        had = getattr(module, "rotary_emb", None)
        module.rotary_emb = adapter.model.model.rotary_emb  # what kvpress's context manager sets on every layer
        try:
            return self._score_module(context, layer, module, cos, sin)
        finally:  # and takes off again: a press leaves the model as it found it (runtime.model_guard)
            if had is None:
                del module.rotary_emb
            else:
                module.rotary_emb = had

    def _score_module(self, context: ScoringContext, layer: int, module: nn.Module, cos: torch.Tensor,
                      sin: torch.Tensor) -> torch.Tensor:
        """:meth:`_score_layer` of ``module``, its attention module with ``rotary_emb`` set."""
        adapter, n = context.adapter, context.n
        kv = context.kv[layer]
        recorded = context.evidence.window_hidden.get(layer)
        hidden = _layer_inputs(recorded, n, adapter.config.hidden_size, cos.dtype, cos.device)
        queries = None
        if adapter.gated or adapter.geometry.rotary_dim < adapter.geometry.head_dim:
            if recorded is not None:  # a scorer that reads no layer input asks for no queries
                queries = adapter.queries(layer, hidden, cos, sin)  # [H, n, d], post-RoPE
                module = _QueryView(module, hidden, queries.transpose(0, 1).reshape(1, n, -1))
            identity = torch.ones(1, n, adapter.geometry.head_dim, dtype=cos.dtype, device=cos.device)
            embeddings = (identity, torch.zeros_like(identity))  # the view's queries are rotated already
        else:
            embeddings = (cos[None], sin[None])
        attentions = None
        if any(c.__name__ in NEEDS_ATTENTIONS for c in type(self.press).__mro__):
            if queries is None:
                queries = adapter.queries(layer, hidden, cos, sin)
            attentions = attention_probs(queries.float(), kv.keys.float(), module.scaling,
                                         causal_tail=n).to(kv.keys.dtype)[None]
        kwargs = {"hidden_states": hidden, "position_embeddings": embeddings,
                  "cache_position": torch.arange(n, device=cos.device), "attention_mask": None}
        per_entry = self.press.score(module, hidden, kv.keys[None], kv.values[None], attentions, kwargs)
        return per_entry[0, :, context.protected :].float()

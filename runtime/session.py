"""The fork protocol (paper, Appendix A): prefill a context once into a parent, fork compacted children.

>>> parent = prefill(model, context_ids, protected=16)
>>> child = parent.fork(plan)            # physical compaction; GDN states copied
>>> child.answer(question_ids, 32)       # every question starts from the state right after the fork
"""

from __future__ import annotations

import hashlib
import numbers

import torch
from torch import nn

from .adapters import ModelAdapter, adapter_for
from .decoding import Answer, chosen_token, decode_budget, stop_tokens
from .errors import ArgumentTypeError, ReleasedError, UsageError, describe
from .evidence import Evidence, EvidenceRecorder, EvidenceRequest
from .forward import ForwardObserver, SequenceState, forward_chunk
from .kv import LayerKV
from .plan import KeepPlan

MAX_PROTECTED = 256
# Prefill chunk by default: activations of a pass grow with its length (the MLP's intermediate states alone are
# 4 x hidden x tokens), so long contexts are prefilled 4,096 tokens at a time; shorter ones in one pass.
DEFAULT_PREFILL_CHUNK = 4096


def context_hash(ids: torch.Tensor) -> str:
    """SHA-256 of the context token ids (int64, little endian)."""
    return hashlib.sha256(ids.detach().to("cpu", torch.int64).numpy().tobytes()).hexdigest()


def _as_ids(ids, adapter: ModelAdapter, what: str) -> torch.Tensor:
    """``[L]`` int64 token ids on the model's device; ``ValueError`` naming the first id outside the vocabulary."""
    try:
        if isinstance(ids, (str, bytes, numbers.Number)) or ids is None:  # text, one number, nothing: not a sequence
            raise TypeError
        ids = torch.as_tensor(ids, device=adapter.device)
    except (TypeError, ValueError, RuntimeError):
        raise ArgumentTypeError(f"{what} must be token ids (a tensor, list or array of integers, shape [L] or "
                                f"[1, L]; encode a text with the tokenizer first), got {describe(ids)}") from None
    if ids.dim() == 2:
        if ids.shape[0] != 1:
            raise ValueError(f"{what}: got a batch of {ids.shape[0]}; one sequence at a time (shape [L] or [1, L])")
        ids = ids[0]
    if ids.numel() == 0:
        raise ValueError(f"{what} is empty: give at least one token id")
    if ids.dim() != 1:
        raise ValueError(f"{what}: expected a 1-D tensor of token ids (shape [L] or [1, L]), got shape "
                         f"{tuple(ids.shape)}")
    if ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{what}: token ids must be of an integer type int64 or int32, got {ids.dtype}")
    vocab = adapter.config.vocab_size
    outside = (ids < 0) | (ids >= vocab)
    if bool(outside.any()):
        index = int(outside.nonzero()[0, 0])
        raise ValueError(f"{what}[{index}] = {int(ids[index])} is not a token id of this model: ids must be in "
                         f"[0, {vocab})")
    return ids.long()


def _check_observer(observer) -> None:
    """``ArgumentTypeError`` unless ``observer`` has what :func:`forward_chunk` reads of a
    :class:`~runtime.forward.ForwardObserver`: ``wants_recurrent_signals``, ``on_attention``, and ``on_recurrent``
    where it wants the signals."""
    if isinstance(observer, type) or not (
            hasattr(observer, "wants_recurrent_signals") and callable(getattr(observer, "on_attention", None))
            and (not observer.wants_recurrent_signals or callable(getattr(observer, "on_recurrent", None)))):
        raise ArgumentTypeError(f"observer must be a ForwardObserver (wants_recurrent_signals, on_attention, and "
                                f"on_recurrent where it wants the signals: runtime.forward), got {describe(observer)}")


class CachedContext:
    """A prefilled context that answers questions without ever changing its own state."""

    def __init__(self, adapter: ModelAdapter, state: SequenceState, n: int, protected: int, digest: str, tokenizer):
        self.adapter = adapter
        self._state = state
        self.n = n
        self.protected = protected
        self.context_hash = digest
        self.tokenizer = tokenizer
        self._busy = False

    # ---- inspection ----------------------------------------------------------------------------------
    @property
    def released(self) -> bool:
        return self._state is None

    #: what to do once this object was released
    _after_release = "fork a new child from its parent (if the parent is not released too)"

    def _live_state(self) -> SequenceState:
        if self._state is None:
            raise ReleasedError(f"this {type(self).__name__.lower()} was released; {self._after_release}")
        return self._state

    @property
    def kv(self) -> dict[int, LayerKV]:
        """Stored attention entries per attention layer."""
        return self._live_state().base

    @property
    def recurrent_states(self) -> dict:
        """Recurrent states (:class:`~runtime.gdn.RecurrentState`) per GDN or Mamba2 layer."""
        return self._live_state().recurrent

    @property
    def kv_nbytes(self) -> int:
        """Bytes of the attention keys and values held (0 once released)."""
        return 0 if self._state is None else sum(layer.nbytes for layer in self._state.base.values())

    @property
    def recurrent_nbytes(self) -> int:
        """Bytes of the GDN and Mamba2 layers' recurrent states (0 once released)."""
        return 0 if self._state is None else sum(s.nbytes for s in self._state.recurrent.values())

    def release(self) -> None:
        """Drop every tensor this object holds so that its memory can be reclaimed."""
        self._state = None

    # ---- questions -----------------------------------------------------------------------------------
    def _check_question(self, question_ids, expected_hash: str | None) -> torch.Tensor:
        self._live_state()
        if expected_hash is not None and not isinstance(expected_hash, str):
            raise ArgumentTypeError(f"context_hash must be the hash of the context asked about (text: "
                                    f"runtime.context_hash(ids), or a cache's .context_hash) or None, got "
                                    f"{describe(expected_hash)}")
        if expected_hash is not None and expected_hash != self.context_hash:
            raise ValueError(
                f"context hash mismatch: this cache holds context {self.context_hash[:12]}…, "
                f"the question was asked of {expected_hash[:12]}…"
            )
        if self._busy:
            raise RuntimeError("a question is already being answered on this cache; ask one question at a time")
        return _as_ids(question_ids, self.adapter, "question_ids")

    def logits(self, question_ids, observer: ForwardObserver | None = None, context_hash: str | None = None):
        """Logits ``[L, V]`` of every question token, continuing from the cached context; the cache is unchanged."""
        ids = self._check_question(question_ids, context_hash)
        if observer is not None:
            _check_observer(observer)
        self._busy = True
        try:
            return forward_chunk(self.adapter, self._state.branch(), ids, observer, all_logits=True)
        finally:
            self._busy = False

    def log_probs(self, question_ids, context_hash: str | None = None) -> torch.Tensor:
        """Float32 next-token log-probabilities ``[L, V]`` after each question token (:meth:`logits` normalised)."""
        return self.logits(question_ids, context_hash=context_hash).float().log_softmax(-1)

    def observe(self, ids, observer: ForwardObserver, context_hash: str | None = None) -> None:
        """Run ``ids`` ``[L]`` after the cached context for what ``observer`` sees (KVzip's reconstruction pass); no
        logits are computed beyond the last token's, and the cache is unchanged."""
        ids = self._check_question(ids, context_hash)
        _check_observer(observer)
        self._busy = True
        try:
            forward_chunk(self.adapter, self._state.branch(), ids, observer)
        finally:
            self._busy = False

    def answer(
        self,
        question_ids,
        max_new_tokens: int,
        eos_token_id: int | list[int] | None = None,
        context_hash: str | None = None,
        choose=None,
    ) -> Answer:
        """Greedy decoding of up to ``max_new_tokens`` after ``question_ids`` ``[L]``.

        The question and the generated tokens go into a scratch branch of the cache, so the next question starts
        from exactly the same state. ``context_hash``, when given, must match the cached context's hash.
        ``choose`` maps the ``[V]`` logits of a step to the next token (default: argmax), e.g. a seeded sampler.
        A ``max_new_tokens`` that is not an integer >= 1, or that would decode past the model's positions, is
        refused before anything runs (:func:`~runtime.decoding.decode_budget`).
        """
        ids = self._check_question(question_ids, context_hash)
        max_new_tokens = decode_budget(max_new_tokens, self.adapter.config, self._state.next_position, ids.numel())
        stop = stop_tokens(eos_token_id)
        if choose is not None and not callable(choose):
            raise ArgumentTypeError(f"choose must map a step's logits to a token (a callable) or be None, got "
                                    f"{describe(choose)}")
        self._busy = True
        try:
            state = self._state.branch()
            logits = forward_chunk(self.adapter, state, ids)
            tokens: list[int] = []
            while True:
                token = int(logits[-1].argmax()) if choose is None else chosen_token(choose(logits[-1]),
                                                                                      logits.shape[-1])
                tokens.append(token)
                if token in stop or len(tokens) >= max_new_tokens:
                    break
                logits = forward_chunk(self.adapter, state, torch.tensor([token], device=ids.device))
        finally:
            self._busy = False
        answer_tokens = [t for t in tokens if t not in stop]
        text = self.tokenizer.decode(answer_tokens) if self.tokenizer is not None else None
        return Answer(tokens, text)


class Child(CachedContext):
    """A physically compacted copy of a parent's cache: the kept entries in new tensors, GDN states copied."""


class Parent(CachedContext):
    """The unpruned cache of one prefilled context, with the evidence its presses asked for.

    Attributes
    ----------
    context_ids : torch.Tensor
        ``[n]``.
    evidence : Evidence
    last_logits : torch.Tensor
        ``[V]`` logits after the last context token.
    """

    _after_release = "its cache and evidence are gone: prefill the context again"

    def __init__(self, adapter, state, context_ids, protected, tokenizer, evidence: Evidence, last_logits):
        super().__init__(adapter, state, context_ids.numel(), protected, context_hash(context_ids), tokenizer)
        self.context_ids = context_ids
        self.evidence = evidence
        self.last_logits = last_logits

    def keep_all_plan(self) -> KeepPlan:
        g = self.adapter.geometry
        return KeepPlan.keep_all(self.n, self.protected, self.adapter.attention_layers, g.num_kv_heads)

    def fork(self, plan: KeepPlan) -> Child:
        """A child holding only the protected prefix plus ``plan``'s entries of every layer and head.

        The kept keys keep their original RoPE phases; the child's next position is ``n``.
        """
        state = self._live_state()
        if not isinstance(plan, KeepPlan):
            raise ArgumentTypeError(f"plan must be a KeepPlan (runtime.KeepPlan: the kept body positions of every "
                                    f"attention layer and KV head, e.g. parent.keep_all_plan() or "
                                    f"presses.Selection(parent, press).plan(allocator, p)), got {describe(plan)}")
        plan.validate(self.n, self.protected, self.adapter.attention_layers, self.adapter.geometry.num_kv_heads)
        prefix = torch.arange(self.protected, device=self.adapter.device)
        base = {
            layer: state.base[layer].gather([torch.cat([prefix, p.to(prefix.device).long()]) for p in heads])
            for layer, heads in plan.layers.items()
        }
        child_state = SequenceState(base, {}, {i: s.clone() for i, s in state.recurrent.items()}, state.next_position)
        return Child(self.adapter, child_state, self.n, self.protected, self.context_hash, self.tokenizer)

    def release(self) -> None:
        super().release()
        self.evidence = Evidence()


def prefill(
    model: nn.Module,
    context_ids,
    protected: int = 0,
    evidence: EvidenceRequest = EvidenceRequest(),
    tokenizer=None,
    chunk_size: int | None = DEFAULT_PREFILL_CHUNK,
) -> Parent:
    """Prefill ``context_ids`` ``[n]`` once into an unpruned :class:`Parent`.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        ``Qwen3_5ForCausalLM``, ``Qwen3_5MoeForCausalLM``, ``Qwen3NextForCausalLM``, ``BambaForCausalLM``,
        ``GraniteMoeHybridForCausalLM``, ``FalconH1ForCausalLM``, ``Qwen3ForCausalLM`` or ``LlamaForCausalLM``.
    context_ids : array-like of int
        ``[n]`` or ``[1, n]``.
    protected : int
        Leading tokens (at most 256) that every method keeps, e.g. the instruction prefix.
    evidence : EvidenceRequest
        What the presses in use need besides the KV cache.
    tokenizer : optional
        Used only to decode answers to text.
    chunk_size : int, optional
        Prefill at most this many tokens per forward pass (each chunk attends to the earlier ones and the GDN
        layers continue from their states), so that activation memory stays bounded on long contexts. The
        cache, logits and evidence equal one pass up to floating-point reassociation. Default
        :data:`DEFAULT_PREFILL_CHUNK`; None: one pass whatever the length.
    """
    adapter = adapter_for(model)
    ids = _as_ids(context_ids, adapter, "context_ids")
    if tokenizer is not None and (isinstance(tokenizer, type) or not callable(getattr(tokenizer, "decode", None))):
        raise ArgumentTypeError(f"tokenizer must be a tokenizer (it decodes answers: tokenizer.decode) or None, got "
                                f"{describe(tokenizer)}")
    if isinstance(protected, bool) or not isinstance(protected, numbers.Integral):
        raise UsageError(f"protected={protected!r} must be an integer number of leading tokens")
    protected = int(protected)
    if not 0 <= protected <= min(MAX_PROTECTED, ids.numel() - 1):
        raise ValueError(
            f"protected={protected} is not allowed: it must be in [0, min({MAX_PROTECTED}, n - 1)] "
            f"for a context of n={ids.numel()} tokens (at least one body token)"
        )
    limit = getattr(adapter.config, "max_position_embeddings", None)
    if limit is not None and ids.numel() > limit:
        raise ValueError(
            f"context of {ids.numel()} tokens is longer than the model's max_position_embeddings ({limit}); "
            "truncate it (SCBench contexts are middle-truncated by the bench)"
        )
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral)
                                   or chunk_size < 1):
        raise UsageError(f"chunk_size={chunk_size!r} must be a positive integer (tokens per prefill pass) or None")
    if not isinstance(evidence, EvidenceRequest):
        raise ArgumentTypeError(f"evidence must be an EvidenceRequest (what the presses in use read besides the KV "
                                f"cache: press.evidence(adapter), or presses.preparation.evidence_for(presses, "
                                f"adapter) for several), got {describe(evidence)}")
    recorder = EvidenceRecorder(evidence)
    state = SequenceState()
    step = int(chunk_size or ids.numel())
    for start in range(0, ids.numel(), step):
        logits = forward_chunk(adapter, state, ids[start : start + step], recorder)
    for layer, (keys, values) in state.tail.items():
        positions = torch.arange(ids.numel(), device=ids.device).expand(keys.shape[0], -1).contiguous()
        state.base[layer] = LayerKV(keys, values, positions)
    state.tail = {}
    return Parent(adapter, state, ids, protected, tokenizer, recorder.result(), logits[-1])

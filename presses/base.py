"""Press protocol: a scorer says how valuable each body KV entry is (higher = keep)."""

from __future__ import annotations

import functools
import json
from abc import ABC, abstractmethod
from typing import ClassVar, Protocol

import torch

from pretrained.model_info import ModelInfo
from runtime import EvidenceRequest
from runtime.adapters import ModelAdapter
from runtime.errors import UsageError
from runtime.evidence import Evidence
from runtime.kv import LayerKV

Scores = dict[int, torch.Tensor]
"""Per attention layer, ``[H_kv, n_body]`` scores over the body positions ``[prot, n)``."""


class ScoringContext(Protocol):
    """What a press may read of a prefilled context: ``runtime.Parent`` satisfies it in the runtime, and the served
    context does inside vLLM (``serving.served_context.ServedContext``), so a press that reads only these scores in
    both.

    Attributes
    ----------
    adapter : ModelAdapter
        The model's layout: attention and recurrent layers, geometry, projections.
    kv : dict[int, LayerKV]
        Per attention layer, the context's keys and values ``[H_kv, n, d]`` (post-RoPE, original positions).
    n : int
        Context length in tokens.
    protected : int
        The protected prefix ``[0, protected)``: never scored, always kept.
    evidence : Evidence
        What the prefill recorded for the presses in use (:meth:`Press.evidence`).
    """

    adapter: ModelAdapter
    kv: dict[int, LayerKV]
    n: int
    protected: int
    evidence: Evidence


class BranchingContext(ScoringContext, Protocol):
    """A context more tokens can be run after without changing it (KVzip's reconstruction pass): ``runtime.Parent``.

    Attributes
    ----------
    context_ids : torch.Tensor
        ``[n]`` the context's token ids.
    tokenizer : tokenizer or None
        What the context was prefilled with (to encode a prompt).
    """

    context_ids: torch.Tensor
    tokenizer: object

    def observe(self, ids, observer, context_hash: str | None = None) -> None:
        """Run ``ids`` after the context (which is left as it was), showing ``observer`` every layer's work."""


class Press(ABC):
    """Base class of every scorer.

    Subclasses are dataclasses holding their hyper-parameters; they declare the prefill evidence they need
    (:meth:`evidence`), refuse models they cannot run on (:meth:`check`), and score a parent (:meth:`score`).
    """

    name: ClassVar[str] = ""
    runs_in_engine: ClassVar[bool] = False
    """Whether the vLLM engine scores with it (:mod:`serving.rules` reads this): it reads only what the engine
    records (the cache, the GDN signals of vLLM's forward, queries at vLLM's attention layers)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # scoring never needs gradients; wrapping here keeps every press file free of the decorator
        if "score" in cls.__dict__:
            cls.score = torch.no_grad()(cls.__dict__["score"])
        if "bind" in cls.__dict__:
            cls.bind = _naming_the_directory(cls.__dict__["bind"])

    #: scores of different layers share one scale, so a global top-B over layers is meaningful
    comparable_scale: ClassVar[bool] = False
    #: :meth:`score` runs passes after the context (``BranchingContext.logits``), not only reads the prefill
    runs_after_context: ClassVar[bool] = False
    #: ``{option: (folder, file patterns)}`` of the options that name a directory this press reads files from (an
    #: estimator, a calibration), with the folder of the model directory :meth:`bind` reads them from when the
    #: option is not given: results name such an option by those files' content, not by its path, and leave it out
    #: where it names the model's own files (:mod:`bench.run.specs`)
    artifact_files: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = {}

    def code_objects(self) -> tuple[type, ...]:
        """Classes outside this press's module whose code decides its scores and that no import of that module
        names (a wrapped library scorer): their source is part of its rows' method code
        (:func:`bench.store.code_version.method_codes`). None by default."""
        return ()

    @property
    def shown_name(self) -> str:
        """The press as a user named it, for messages (a wrapper of other scorers names the one it wraps)."""
        return self.name

    def evidence(self, adapter: ModelAdapter) -> EvidenceRequest:
        """What the prefill must record for this press (nothing beyond the KV cache by default)."""
        return EvidenceRequest()

    def bind(self, model: ModelInfo | None) -> None:
        """Load what this press reads from the model's directory (``model.directory``: an estimator, a calibration)
        if it was not given one and the directory has it; :meth:`check` then refuses a press still missing it.
        ``model`` is the model read once (:class:`~pretrained.model_info.ModelInfo`: its weights' fingerprint
        included), or None for a model built in memory. A no-op by default."""

    def check(self, adapter: ModelAdapter) -> None:
        """Raise ``ValueError`` if this press cannot run on the model behind ``adapter`` (loads nothing)."""

    def check_context(self, n: int) -> None:
        """Raise ``UsageError`` if this press cannot score a context of ``n`` tokens (called before its prefill,
        once the length is known); a no-op by default."""

    @abstractmethod
    def score(self, context: ScoringContext) -> Scores:
        """Scores ``[H_kv, n_body]`` per attention layer for the body of ``context``."""


def _naming_the_directory(bind):
    """``bind`` whose damaged artifact (a cut safetensors file, JSON that does not parse) is one ``ValueError``
    naming the model directory, instead of the reader's own error that names no file."""
    from safetensors import SafetensorError

    @functools.wraps(bind)
    def wrapped(self, model):
        try:
            return bind(self, model)
        except (SafetensorError, json.JSONDecodeError) as error:
            raise ValueError(f"{model.directory}: the artifacts press {self.name!r} reads there are damaged ({error}); "
                             "write them again (bench calibrate, bench train) or copy them whole") from None

    return wrapped


def group_reduce(per_query_head: torch.Tensor, group_size: int, how: str) -> torch.Tensor:
    """``[H, n]`` -> ``[H_kv, n]`` by mean or max over each KV head's query heads."""
    grouped = per_query_head.view(-1, group_size, per_query_head.shape[-1])
    if how == "mean":
        return grouped.mean(1)
    if how == "max":
        return grouped.amax(1)
    raise UsageError(f"unknown GQA aggregation {how!r}; choose 'mean' or 'max'")

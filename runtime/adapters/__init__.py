"""Model adapters: one per architecture family, chosen by ``config.model_type``. Each states its family's facts
(:class:`~.base.ModelAdapter`); everything else that asks about a family reads them from :data:`ADAPTERS`."""

from __future__ import annotations

from torch import nn

from ..errors import UsageError
from .bamba import BambaAdapter
from .base import AttentionGeometry, ModelAdapter, apply_rope, layers_with
from .dense import DenseAdapter
from .falcon_h1 import FalconH1Adapter
from .granitemoehybrid import GraniteMoeHybridAdapter
from .qwen3_5 import Qwen3_5Adapter
from .qwen3_5_moe import Qwen3_5MoeAdapter
from .qwen3_next import Qwen3NextAdapter

ADAPTERS: tuple[type[ModelAdapter], ...] = (Qwen3_5Adapter, Qwen3_5MoeAdapter, Qwen3NextAdapter, DenseAdapter,
                                            BambaAdapter, GraniteMoeHybridAdapter, FalconH1Adapter)
MODEL_TYPES: dict[str, type[ModelAdapter]] = {model_type: adapter for adapter in ADAPTERS
                                               for model_type in adapter.model_types}
"""``model_type`` -> the adapter that serves it."""

#: hybrid families transformers ships that no adapter serves, with the reason
REFUSED = {
    "jamba": "its recurrent layers are Mamba1 (a per-channel selective scan with a [d_inner, d_state] state), not the "
             "Mamba2 scan of runtime/mamba2.py, and its attention layers have no RoPE",
    "zamba2": "its attention is one shared transformer block (attention and MLP, with per-layer LoRA adapters) whose "
              "input is the hidden state concatenated with the original embeddings, added in front of a Mamba2 layer; "
              "the runtime's layer loop (norm, one mixer, residual, MLP) does not express it",
}


def adapter_for(model: nn.Module) -> ModelAdapter:
    """Return the adapter for ``model``; raise ``UsageError`` naming the supported model types otherwise."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in MODEL_TYPES:
        if not hasattr(model, "lm_head") or not hasattr(getattr(model, "model", None), "layers"):
            raise UsageError(
                f"{type(model).__name__} is not a causal-LM wrapper with model.layers and lm_head; "
                "load it with AutoModelForCausalLM"
            )
        return MODEL_TYPES[model_type](model)
    supported = sorted(MODEL_TYPES)
    if model_type in REFUSED:
        raise UsageError(f"model type {model_type!r} ({type(model).__name__}) is not supported: "
                         f"{REFUSED[model_type]}; supported: {supported}")
    raise UsageError(f"unsupported model type {model_type!r} ({type(model).__name__}); supported: {supported}")


__all__ = ["ADAPTERS", "MODEL_TYPES", "REFUSED", "AttentionGeometry", "ModelAdapter", "adapter_for", "apply_rope",
           "layers_with"]

"""Model adapters: one per architecture family, chosen by ``config.model_type``."""

from __future__ import annotations

from torch import nn

from .bamba import BambaAdapter
from .base import AttentionGeometry, ModelAdapter, apply_rope
from .dense import DenseAdapter
from .falcon_h1 import FalconH1Adapter
from .granitemoehybrid import GraniteMoeHybridAdapter
from .qwen3_5 import Qwen3_5Adapter
from .qwen3_5_moe import Qwen3_5MoeAdapter
from .qwen3_next import Qwen3NextAdapter

ADAPTERS: tuple[type[ModelAdapter], ...] = (Qwen3_5Adapter, Qwen3_5MoeAdapter, Qwen3NextAdapter, DenseAdapter,
                                            BambaAdapter, GraniteMoeHybridAdapter, FalconH1Adapter)

#: hybrid families transformers ships that no adapter serves, with the reason
REFUSED = {
    "jamba": "its recurrent layers are Mamba1 (a per-channel selective scan with a [d_inner, d_state] state), not the "
             "Mamba2 scan of runtime/mamba2.py, and its attention layers have no RoPE",
    "zamba2": "its attention is one shared transformer block (attention and MLP, with per-layer LoRA adapters) whose "
              "input is the hidden state concatenated with the original embeddings, added in front of a Mamba2 layer; "
              "the runtime's layer loop (norm, one mixer, residual, MLP) does not express it",
}


def adapter_for(model: nn.Module) -> ModelAdapter:
    """Return the adapter for ``model``; raise ``ValueError`` naming the supported model types otherwise."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    for adapter in ADAPTERS:
        if model_type in adapter.model_types:
            if not hasattr(model, "lm_head") or not hasattr(getattr(model, "model", None), "layers"):
                raise ValueError(
                    f"{type(model).__name__} is not a causal-LM wrapper with model.layers and lm_head; "
                    "load it with AutoModelForCausalLM"
                )
            return adapter(model)
    supported = sorted(t for adapter in ADAPTERS for t in adapter.model_types)
    if model_type in REFUSED:
        raise ValueError(f"model type {model_type!r} ({type(model).__name__}) is not supported: {REFUSED[model_type]}; "
                         f"supported: {supported}")
    raise ValueError(f"unsupported model type {model_type!r} ({type(model).__name__}); supported: {supported}")


__all__ = ["ADAPTERS", "REFUSED", "AttentionGeometry", "ModelAdapter", "adapter_for", "apply_rope"]

"""Dense decoders (Qwen3, Llama): every layer is attention, no output gate, no GDN state."""

from __future__ import annotations

import torch

from .base import ModelAdapter
from .tiny import attention_common


class DenseAdapter(ModelAdapter):
    model_types = ("qwen3", "llama")
    gated = False

    @classmethod
    def tiny_configs(cls) -> dict[str, tuple[type, dict]]:
        from transformers import LlamaConfig, Qwen3Config

        return {"qwen3": (Qwen3Config, dict(**attention_common(3), hidden_size=64, intermediate_size=96, head_dim=16)),
                "llama": (LlamaConfig, dict(**attention_common(2), hidden_size=64, intermediate_size=96))}

    def project_query(self, layer_idx: int, hidden: torch.Tensor) -> tuple[torch.Tensor, None]:
        module = self.attention_module(layer_idx)
        query = module.q_proj(hidden[0]).view(hidden.shape[1], -1, self.geometry.head_dim)
        if getattr(module, "q_norm", None) is not None:
            query = module.q_norm(query)
        return query.transpose(0, 1), None

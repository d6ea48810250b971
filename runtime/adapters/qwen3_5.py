"""Qwen3.5 (text): GDN layers with a fused ``in_proj_qkv``; gated attention with partial RoPE."""

from __future__ import annotations

import torch

from ..errors import UsageError
from .base import ModelAdapter
from .tiny import QWEN3_5_ROPE, gdn_common

#: ``layer_types`` of the config -> the runtime's layer kind
GDN_LAYER_TYPES = {"linear_attention": "gdn", "full_attention": "attention"}


class Qwen3_5Adapter(ModelAdapter):
    model_types = ("qwen3_5_text", "qwen3_5")
    served_by_engine = True
    gated = True

    @classmethod
    def layer_kinds_from(cls, config) -> tuple[str, ...]:
        """GDN layers where ``layer_types`` says ``"linear_attention"``, attention where ``"full_attention"``."""
        unknown = sorted(set(config.layer_types) - set(GDN_LAYER_TYPES))
        if unknown:
            raise UsageError(f"{config.model_type} with layer_types {unknown} is not supported: the runtime runs "
                             f"{', '.join(GDN_LAYER_TYPES)} layers")
        return tuple(GDN_LAYER_TYPES[kind] for kind in config.layer_types)

    @classmethod
    def tiny_configs(cls) -> dict[str, tuple[type, dict]]:
        from transformers import Qwen3_5TextConfig

        return {"qwen3_5": (Qwen3_5TextConfig, dict(**gdn_common(8), rope_parameters=QWEN3_5_ROPE))}

    def project_query(self, layer_idx: int, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # q_proj emits 2·d per head: the query half, then the output-gate half.
        module = self.attention_module(layer_idx)
        length, head_dim = hidden.shape[1], self.geometry.head_dim
        query, gate = torch.chunk(module.q_proj(hidden[0]).view(length, -1, 2 * head_dim), 2, dim=-1)
        return module.q_norm(query).transpose(0, 1), gate

    def gdn_projections(self, layer_idx: int, hidden: torch.Tensor):
        module = self.gdn_module(layer_idx)
        batch, length, _ = hidden.shape
        mixed_qkv = module.in_proj_qkv(hidden).transpose(1, 2)
        z = module.in_proj_z(hidden).reshape(batch, length, -1, module.head_v_dim)
        return mixed_qkv, z, module.in_proj_b(hidden), module.in_proj_a(hidden)

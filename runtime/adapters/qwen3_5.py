"""Qwen3.5 (text): GDN layers with a fused ``in_proj_qkv``; gated attention with partial RoPE."""

from __future__ import annotations

import torch

from .base import ModelAdapter


class Qwen3_5Adapter(ModelAdapter):
    model_types = ("qwen3_5_text", "qwen3_5")
    gated = True

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

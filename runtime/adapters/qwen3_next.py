"""Qwen3-Next: like Qwen3.5, but the GDN projections come fused per key head (``in_proj_qkvz``, ``in_proj_ba``)."""

from __future__ import annotations

import torch

from .qwen3_5 import Qwen3_5Adapter
from .tiny import gdn_common


class Qwen3NextAdapter(Qwen3_5Adapter):
    model_types = ("qwen3_next",)

    @classmethod
    def tiny_configs(cls) -> dict[str, tuple[type, dict]]:
        from transformers import Qwen3NextConfig

        return {"qwen3_next": (Qwen3NextConfig, dict(
            **gdn_common(4), num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=32, decoder_sparse_step=1, partial_rotary_factor=0.25,
        ))}

    def gdn_projections(self, layer_idx: int, hidden: torch.Tensor):
        module = self.gdn_module(layer_idx)
        query, key, value, z, b, a = module.fix_query_key_value_ordering(
            module.in_proj_qkvz(hidden), module.in_proj_ba(hidden)
        )
        mixed_qkv = torch.cat([t.reshape(t.shape[0], t.shape[1], -1) for t in (query, key, value)], dim=-1)
        return mixed_qkv.transpose(1, 2), z, b, a

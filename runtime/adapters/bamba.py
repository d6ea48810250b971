"""Bamba: Mamba2 mixer layers and Llama-like RoPE attention layers (no q/k norms, no output gate); dense MLPs.

The Mamba2 layers run through :func:`runtime.mamba2.mamba2_forward`; this adapter hands it the mixer's projections
and its gated output norm. Granite 4.0-H (:mod:`.granitemoehybrid`) and Falcon-H1 (:mod:`.falcon_h1`) reuse it.
"""

from __future__ import annotations

import torch
from torch import nn

from .dense import DenseAdapter
from .tiny import mamba2_common


class BambaAdapter(DenseAdapter):
    model_types = ("bamba",)

    @classmethod
    def layer_kinds_from(cls, config) -> tuple[str, ...]:
        """Attention at ``attn_layer_indices``, Mamba2 everywhere else (every layer when it is unset)."""
        attention = set(config.attn_layer_indices or ())
        return tuple("attention" if i in attention else "mamba2" for i in range(config.num_hidden_layers))

    @classmethod
    def tiny_configs(cls) -> dict[str, tuple[type, dict]]:
        """Mamba2, attention, Mamba2, attention: the per-layer allocators see two attention layers."""
        from transformers import BambaConfig

        return {"bamba": (BambaConfig, dict(**mamba2_common(4), attn_layer_indices=[1, 3]))}

    def signal_heads(self) -> int:
        return self.mamba_module(self.mamba2_layers[0]).num_heads

    def mlp(self, layer_idx: int, hidden: torch.Tensor) -> torch.Tensor:
        layer = self.layers[layer_idx]
        return layer.feed_forward(layer.pre_ff_layernorm(hidden))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(self.model.model.final_layernorm(hidden))[0]

    # ---- Mamba2 ---------------------------------------------------------------------------------------
    def mamba_module(self, layer_idx: int) -> nn.Module:
        return self.layers[layer_idx].mamba

    def mamba_projections(self, layer_idx: int, hidden: torch.Tensor):
        """``[1, L, D]`` -> gate ``z`` ``[1, L, I]``, pre-conv ``xBC`` ``[1, L, conv_dim]``, ``dt`` ``[1, L, H]``."""
        module = self.mamba_module(layer_idx)
        return module.in_proj(hidden).split([module.intermediate_size, module.conv_dim, module.num_heads], dim=-1)

    def mamba_output(self, layer_idx: int, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """``[1, L, I]`` float32 scan output (D term included) and gate -> ``[1, L, D]`` layer output."""
        module = self.mamba_module(layer_idx)
        return module.out_proj(module.norm(y, gate).to(gate.dtype))

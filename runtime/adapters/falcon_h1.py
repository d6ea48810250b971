"""Falcon-H1: every layer runs a Mamba2 mixer and a RoPE attention side by side on the same normed input and adds
their outputs (layer kind ``"mamba2+attention"``); dense MLPs; µP multipliers throughout.

The multipliers are folded into the adapter's pieces, as transformers' layer applies them: embeddings ×
``embedding_multiplier``; attention input × ``attention_in_multiplier`` (:meth:`attention_input`, so that presses
recompute queries from what the projections read), keys × ``key_multiplier`` before RoPE, attention output ×
``attention_out_multiplier``; Mamba2 input × ``ssm_in_multiplier``, its projections × the mixer's ``mup_vector``, its
output × ``ssm_out_multiplier``; logits × ``lm_head_multiplier``. The MLP applies its own multipliers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .bamba import BambaAdapter
from .tiny import mamba2_common


class FalconH1Adapter(BambaAdapter):
    model_types = ("falcon_h1",)

    @classmethod
    def layer_kinds_from(cls, config) -> tuple[str, ...]:
        return ("mamba2+attention",) * config.num_hidden_layers

    @classmethod
    def tiny_configs(cls) -> dict[str, tuple[type, dict]]:
        """Falcon-H1's parallel layers with every µP multiplier away from 1. The mixer's optional gated norm
        (``mamba_rms_norm``, grouped; before or after the gate) is on: without it the random mixer's output is ~1e-3
        and a lost state would hardly show."""
        from transformers import FalconH1Config

        return {"falcon_h1": (FalconH1Config, dict(
            **mamba2_common(2), mamba_d_ssm=32, mamba_rms_norm=True, mamba_norm_before_gate=False,
            embedding_multiplier=2.0, lm_head_multiplier=0.5, key_multiplier=0.7, attention_in_multiplier=1.5,
            attention_out_multiplier=0.8, ssm_in_multiplier=1.3, ssm_out_multiplier=0.6, mlp_multipliers=[1.2, 0.7],
            ssm_multipliers=[1.1, 0.9, 1.2, 0.8, 1.05],
        ))}

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return super().embed(ids) * self.config.embedding_multiplier

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return super().logits(hidden) * self.config.lm_head_multiplier

    def attention_input(self, layer_idx: int, hidden: torch.Tensor) -> torch.Tensor:
        return hidden * self.config.attention_in_multiplier

    def project_kv(self, layer_idx: int, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = super().project_kv(layer_idx, hidden)
        return keys * self.config.key_multiplier, values

    def output(self, layer_idx: int, attn: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        return super().output(layer_idx, attn, gate) * self.config.attention_out_multiplier

    def mamba_projections(self, layer_idx: int, hidden: torch.Tensor):
        module = self.mamba_module(layer_idx)
        projected = module.in_proj(hidden * module.ssm_in_multiplier) * module.mup_vector
        return projected.split([module.intermediate_size, module.conv_dim, module.num_heads], dim=-1)

    def mamba_output(self, layer_idx: int, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        module = self.mamba_module(layer_idx)
        # the gated norm is optional here (``mamba_rms_norm``); without it the gate multiplies the scan output
        scan = module.norm(y, gate) if module.mamba_rms_norm else y * F.silu(gate)
        # the norm returns [1, I] for a single token: restore the sequence axis
        out = module.out_proj(scan.to(gate.dtype)).reshape(1, y.shape[1], -1)
        return out * self.config.ssm_out_multiplier

"""Granite 4.0-H (``granitemoehybrid``): Bamba's Mamba2 and attention layers with µP multipliers, every MLP a
top-k routed MoE block plus a shared MLP (or the shared MLP alone when ``num_local_experts`` is 0).

The multipliers are folded into the adapter's pieces so that the shared layer loop (``h + mixer``, ``h + mlp``)
computes what transformers' layer does: embeddings × ``embedding_multiplier``; every mixer and MLP output ×
``residual_multiplier`` before it joins the residual stream; attention logits × ``attention_multiplier`` (the
module's own ``scaling``); logits ÷ ``logits_scaling``.

The MoE block sizes its expert groups with ``.tolist()``, which a batch of children answered under ``torch.func.vmap``
(:mod:`runtime.batch`) cannot run: there the adapter evaluates every expert on every token and weights each by its
routing gate (zero where the router did not choose it), which adds the same terms in the same (ascending expert)
order as the block's ``index_add``. Outside vmap the block itself runs, computing only the chosen experts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch._C._functorch import is_batchedtensor

from .bamba import BambaAdapter
from .tiny import mamba2_common

#: ``layer_types`` of the config -> the runtime's layer kind (transformers 5.2 writes ``mamba`` / ``attention``; the
#: 5.19 of the serving environment ``linear_attention`` / ``full_attention``)
GRANITE_LAYER_TYPES = {"mamba": "mamba2", "attention": "attention", "linear_attention": "mamba2",
                       "full_attention": "attention"}


class GraniteMoeHybridAdapter(BambaAdapter):
    model_types = ("granitemoehybrid",)

    @classmethod
    def layer_kinds_from(cls, config) -> tuple[str, ...]:
        """Mamba2 where ``layer_types`` says ``"mamba"`` (``"linear_attention"``), attention where ``"attention"``
        (``"full_attention"``); every layer Mamba2 when ``layer_types`` is unset (as transformers builds it)."""
        # the config itself refuses any other layer type
        layer_types = config.layer_types or ["mamba"] * config.num_hidden_layers
        return tuple(GRANITE_LAYER_TYPES[kind] for kind in layer_types)

    @classmethod
    def tiny_configs(cls) -> dict[str, tuple[type, dict]]:
        """Granite 4.0-H's layout with RoPE attention (the adapter refuses NoPE): each MLP a top-1-of-2 MoE plus a
        shared MLP (``num_local_experts=0``: the shared MLP alone, as the dense Granite 4.0-H models); µP
        multipliers that differ from 1 everywhere (embeddings, residuals, attention logits, logits)."""
        from transformers import GraniteMoeHybridConfig

        return {"granitemoehybrid": (GraniteMoeHybridConfig, dict(
            **mamba2_common(4), layer_types=["mamba", "attention", "mamba", "attention"],
            position_embedding_type="rope", num_local_experts=2, num_experts_per_tok=1, shared_intermediate_size=24,
            embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=2.0,
        ))}

    def __init__(self, model: nn.Module):
        position = model.config.position_embedding_type
        if position != "rope":
            # Granite 4.0-H checkpoints ship with NoPE attention: the runtime itself would run it, but TriAttention
            # and the kvpress bridge read RoPE phases and do not refuse a model without them
            raise ValueError(
                f"granitemoehybrid with position_embedding_type={position!r} is not supported: only 'rope' is "
                "(TriAttention and the kvpress bridge read RoPE phases, and a NoPE model has none)"
            )
        super().__init__(model)
        self.residual_multiplier = model.config.residual_multiplier

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return super().embed(ids) * self.config.embedding_multiplier

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(self.model.model.norm(hidden))[0] / self.config.logits_scaling

    def mlp(self, layer_idx: int, hidden: torch.Tensor) -> torch.Tensor:
        layer = self.layers[layer_idx]
        x = layer.post_attention_layernorm(hidden)
        out = layer.shared_mlp(x)
        moe = layer.block_sparse_moe
        if moe is not None:
            out = (_every_expert(moe, x) if is_batchedtensor(x) else moe(x)) + out
        return out * self.residual_multiplier

    def output(self, layer_idx: int, attn: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        return super().output(layer_idx, attn, gate) * self.residual_multiplier

    def mamba_output(self, layer_idx: int, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return super().mamba_output(layer_idx, y, gate) * self.residual_multiplier


def _every_expert(moe: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """``GraniteMoeHybridMoE`` on ``[1, L, D]`` without data-dependent shapes: every expert on every token, weighted by
    the top-k softmax gate of the block's router (0 for the experts it did not choose)."""
    tokens = hidden.reshape(-1, hidden.shape[-1])
    logits = moe.router.layer(tokens).float()
    top_logits, top_experts = logits.topk(moe.router.top_k, dim=1)
    gates = torch.zeros_like(logits).type_as(tokens).scatter(1, top_experts, top_logits.softmax(1).type_as(tokens))
    out = torch.zeros_like(tokens)
    for expert in range(gates.shape[1]):
        activated, linear = F.linear(tokens, moe.input_linear.weight[expert]).chunk(2, dim=-1)
        expert_out = F.linear(moe.activation(activated) * linear, moe.output_linear.weight[expert])
        out = out + expert_out * gates[:, expert, None]
    return out.view_as(hidden)

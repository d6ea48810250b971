"""Tiny random models built from configs (no download): one per architecture family the runtime supports."""

from __future__ import annotations

import math

import torch
from transformers import (
    BambaConfig,
    BambaForCausalLM,
    FalconH1Config,
    FalconH1ForCausalLM,
    GraniteMoeHybridConfig,
    GraniteMoeHybridForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3_5ForCausalLM,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

VOCAB = 97
#: Qwen3.5's partial, interleaved multimodal RoPE (text positions use all three sections alike)
QWEN3_5_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                "mrope_section": [1, 1, 0], "mrope_interleaved": True}


def hybrid_common(num_layers: int) -> dict:
    return dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_conv_kernel_dim=4, full_attention_interval=4, max_position_embeddings=32768,
        tie_word_embeddings=False,
    )


def perturbed(model):
    torch.manual_seed(1234)
    # random init leaves RMSNorm weights at their zero "(1 + w)" offset; perturb everything so that a wrong
    # index, sign or norm would show in the outputs
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.float().eval()


def qwen3_5(num_layers: int = 8, seed: int = 0) -> Qwen3_5ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3_5TextConfig(**hybrid_common(num_layers), rope_parameters=QWEN3_5_ROPE)
    return perturbed(Qwen3_5ForCausalLM(config))


def qwen3_5_moe(num_layers: int = 4, seed: int = 0) -> Qwen3_5MoeForCausalLM:
    """Every layer's MLP a sparse-MoE block routing each token to 1 of 2 experts (plus the shared expert);
    attention every second layer, so that the per-layer allocators see two attention layers."""
    torch.manual_seed(seed)
    config = Qwen3_5MoeTextConfig(
        **{**hybrid_common(num_layers), "hidden_size": 32, "full_attention_interval": 2}, num_experts=2,
        num_experts_per_tok=1, moe_intermediate_size=16, shared_expert_intermediate_size=16,
        rope_parameters=QWEN3_5_ROPE,
    )
    return perturbed(Qwen3_5MoeForCausalLM(config))


def qwen3_next(num_layers: int = 4, seed: int = 0) -> Qwen3NextForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3NextConfig(
        **hybrid_common(num_layers), num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, decoder_sparse_step=1, partial_rotary_factor=0.25,
    )
    return perturbed(Qwen3NextForCausalLM(config))


def qwen3(seed: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=32768, tie_word_embeddings=False,
    )
    return perturbed(Qwen3ForCausalLM(config))


def llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=False,
    )
    return perturbed(LlamaForCausalLM(config))


def mamba2_common(num_layers: int) -> dict:
    """Mamba2 mixers of 4 heads of 8 channels in 2 groups (B and C shared by two heads each), a 16-wide state and
    8-token scan chunks, so that a 150-token context crosses many chunk boundaries on transformers' own path."""
    return dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=num_layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=False, mamba_n_heads=4,
        mamba_d_head=8, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=1, mamba_chunk_size=8,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )


def mamba2_init(model):
    """Mamba2's own initialisation of the step Δ (log-uniform in [time_step_min, time_step_max] through an inverse
    softplus): transformers' ``_init_weights`` sets ``dt_bias`` to 1, where every head forgets within a few tokens
    and a lost state would hardly show; with Δ ≥ 0.001 the slowest head keeps a half-life of hundreds of tokens."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in model.model.layers:
            mixer = getattr(layer, "mamba", None)
            if mixer is not None:
                low, high = math.log(mixer.time_step_min), math.log(mixer.time_step_max)
                dt = torch.exp(torch.rand(mixer.num_heads, generator=generator) * (high - low) + low)
                mixer.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
                # a small skip D, so that the gated norm's output is mostly the state's read-out C·h, not D·x
                mixer.D.fill_(0.1)
    return perturbed(model)


def bamba(num_layers: int = 4, seed: int = 0) -> BambaForCausalLM:
    """Mamba2, attention, Mamba2, attention: the per-layer allocators see two attention layers."""
    torch.manual_seed(seed)
    config = BambaConfig(**mamba2_common(num_layers), attn_layer_indices=[1, 3])
    return mamba2_init(BambaForCausalLM(config))


def granitemoehybrid(num_layers: int = 4, seed: int = 0, num_local_experts: int = 2,
                     num_experts_per_tok: int = 1) -> GraniteMoeHybridForCausalLM:
    """Granite 4.0-H's layout with RoPE attention (the adapter refuses NoPE): each MLP a top-1-of-2 MoE plus a
    shared MLP (top-k of ``num_local_experts``; the shared MLP alone with 0 experts, as the dense Granite 4.0-H
    models); µP multipliers that differ from 1 everywhere (embeddings, residuals, attention logits, logits)."""
    torch.manual_seed(seed)
    config = GraniteMoeHybridConfig(
        **mamba2_common(num_layers), layer_types=["mamba", "attention", "mamba", "attention"][:num_layers],
        position_embedding_type="rope", num_local_experts=num_local_experts, num_experts_per_tok=num_experts_per_tok,
        shared_intermediate_size=24, embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.2,
        logits_scaling=2.0,
    )
    return mamba2_init(GraniteMoeHybridForCausalLM(config))


def falcon_h1(num_layers: int = 2, seed: int = 0, mamba_rms_norm: bool = True,
              mamba_norm_before_gate: bool = False) -> FalconH1ForCausalLM:
    """Falcon-H1's parallel layers (Mamba2 and RoPE attention side by side in every layer) with every µP multiplier
    away from 1. ``mamba_rms_norm`` switches the mixer's optional gated norm (grouped; before or after the gate);
    it is on by default because without it the random mixer's output is ~1e-3 and a lost state would hardly show."""
    torch.manual_seed(seed)
    config = FalconH1Config(
        **mamba2_common(num_layers), mamba_d_ssm=32, mamba_rms_norm=mamba_rms_norm,
        mamba_norm_before_gate=mamba_norm_before_gate,
        embedding_multiplier=2.0, lm_head_multiplier=0.5, key_multiplier=0.7, attention_in_multiplier=1.5,
        attention_out_multiplier=0.8, ssm_in_multiplier=1.3, ssm_out_multiplier=0.6, mlp_multipliers=[1.2, 0.7],
        ssm_multipliers=[1.1, 0.9, 1.2, 0.8, 1.05],
    )
    return mamba2_init(FalconH1ForCausalLM(config))


MODELS = {"qwen3_5": qwen3_5, "qwen3_5_moe": qwen3_5_moe, "qwen3_next": qwen3_next, "qwen3": qwen3, "llama": llama,
          "bamba": bamba, "granitemoehybrid": granitemoehybrid, "falcon_h1": falcon_h1}

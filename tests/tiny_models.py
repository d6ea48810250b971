"""Tiny random models built from configs (no download): one per architecture family the runtime supports."""

from __future__ import annotations

import torch
from transformers import (
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


def _hybrid_common(num_layers: int) -> dict:
    return dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_conv_kernel_dim=4, full_attention_interval=4, max_position_embeddings=32768,
        tie_word_embeddings=False,
    )


def _finish(model):
    torch.manual_seed(1234)
    # random init leaves RMSNorm weights at their zero "(1 + w)" offset; perturb everything so that a wrong
    # index, sign or norm would show in the outputs
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.float().eval()


def qwen3_5(num_layers: int = 8, seed: int = 0) -> Qwen3_5ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3_5TextConfig(**_hybrid_common(num_layers), rope_parameters=QWEN3_5_ROPE)
    return _finish(Qwen3_5ForCausalLM(config))


def qwen3_5_moe(num_layers: int = 4, seed: int = 0) -> Qwen3_5MoeForCausalLM:
    """Every layer's MLP a sparse-MoE block routing each token to 1 of 2 experts (plus the shared expert);
    attention every second layer, so that the per-layer allocators see two attention layers."""
    torch.manual_seed(seed)
    config = Qwen3_5MoeTextConfig(
        **{**_hybrid_common(num_layers), "hidden_size": 32, "full_attention_interval": 2}, num_experts=2,
        num_experts_per_tok=1, moe_intermediate_size=16, shared_expert_intermediate_size=16,
        rope_parameters=QWEN3_5_ROPE,
    )
    return _finish(Qwen3_5MoeForCausalLM(config))


def qwen3_next(num_layers: int = 4, seed: int = 0) -> Qwen3NextForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3NextConfig(
        **_hybrid_common(num_layers), num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, decoder_sparse_step=1, partial_rotary_factor=0.25,
    )
    return _finish(Qwen3NextForCausalLM(config))


def qwen3(seed: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=32768, tie_word_embeddings=False,
    )
    return _finish(Qwen3ForCausalLM(config))


def llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=False,
    )
    return _finish(LlamaForCausalLM(config))


MODELS = {"qwen3_5": qwen3_5, "qwen3_5_moe": qwen3_5_moe, "qwen3_next": qwen3_next, "qwen3": qwen3, "llama": llama}

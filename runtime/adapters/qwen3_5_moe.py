"""Qwen3.5-MoE (text): Qwen3.5's GDN and gated attention layers; every MLP is a routed sparse-MoE block.

The block (top-k router, routed experts, sigmoid-gated shared expert) maps ``[B, L, D]`` to ``[B, L, D]`` per token,
so the base adapter's :meth:`~runtime.adapters.base.ModelAdapter.mlp` calls it as a module and nothing else
changes. Routing is per token: a chunk, a batch of children or one token at a time route each token alike.
"""

from __future__ import annotations

from .qwen3_5 import Qwen3_5Adapter
from .tiny import QWEN3_5_ROPE, gdn_common


class Qwen3_5MoeAdapter(Qwen3_5Adapter):
    # AutoModelForCausalLM builds the "qwen3_5_moe_text" model from a multimodal "qwen3_5_moe" checkpoint; the
    # multimodal wrapper handed over itself is matched so that it is refused with the way to load it
    model_types = ("qwen3_5_moe_text", "qwen3_5_moe")

    @classmethod
    def tiny_configs(cls) -> dict[str, tuple[type, dict]]:
        """Every layer's MLP a sparse-MoE block routing each token to 1 of 2 experts (plus the shared expert);
        attention every second layer, so that the per-layer allocators see two attention layers."""
        from transformers import Qwen3_5MoeTextConfig

        settings = {**gdn_common(4), "hidden_size": 32, "full_attention_interval": 2}
        return {"qwen3_5_moe": (Qwen3_5MoeTextConfig, dict(
            **settings, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
            shared_expert_intermediate_size=16, rope_parameters=QWEN3_5_ROPE,
        ))}

"""Qwen3.5-MoE (text): Qwen3.5's GDN and gated attention layers; every MLP is a routed sparse-MoE block.

The block (top-k router, routed experts, sigmoid-gated shared expert) maps ``[B, L, D]`` to ``[B, L, D]`` per token,
so the base adapter's :meth:`~runtime.adapters.base.ModelAdapter.mlp` calls it as a module and nothing else
changes. Routing is per token: a chunk, a batch of children or one token at a time route each token alike.
"""

from __future__ import annotations

from .qwen3_5 import Qwen3_5Adapter


class Qwen3_5MoeAdapter(Qwen3_5Adapter):
    # AutoModelForCausalLM builds the "qwen3_5_moe_text" model from a multimodal "qwen3_5_moe" checkpoint; the
    # multimodal wrapper handed over itself is matched so that it is refused with the way to load it
    model_types = ("qwen3_5_moe_text", "qwen3_5_moe")

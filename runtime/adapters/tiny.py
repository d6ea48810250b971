"""The sizes the tiny random test models share: each adapter's :meth:`~.base.ModelAdapter.tiny_configs` starts from
these, and :mod:`testing.tiny_models` builds and initialises the models (no download). Small enough for a test to run
in seconds on a CPU; large enough that grouped-query attention (4 query heads on 2 KV heads), partial RoPE and scans
over many chunks all occur."""

from __future__ import annotations

VOCAB = 97

QWEN3_5_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                "mrope_section": [1, 1, 0], "mrope_interleaved": True}
"""Qwen3.5's partial, interleaved multimodal RoPE (text positions use all three sections alike)."""


def attention_common(num_layers: int) -> dict:
    """The attention (and embedding) sizes of every tiny model: 4 query heads on 2 KV heads."""
    return dict(vocab_size=VOCAB, num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=32768, tie_word_embeddings=False)


def gdn_common(num_layers: int) -> dict:
    """A Gated DeltaNet hybrid: attention every fourth layer, GDN layers of 2 key heads and 4 value heads of 8."""
    return dict(
        **attention_common(num_layers), hidden_size=64, intermediate_size=96, head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_conv_kernel_dim=4, full_attention_interval=4,
    )


def mamba2_common(num_layers: int) -> dict:
    """Mamba2 mixers of 4 heads of 8 channels in 2 groups (B and C shared by two heads each), a 16-wide state and
    8-token scan chunks, so that a 150-token context crosses many chunk boundaries on transformers' own path."""
    return dict(
        **attention_common(num_layers), hidden_size=32, intermediate_size=48, mamba_n_heads=4, mamba_d_head=8,
        mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=1, mamba_chunk_size=8,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )

"""A Qwen3.5 hybrid initialised from a pretrained Llama-architecture teacher (SmolLM2): the starting point of
:mod:`hybridmodel.distill`.

Layer placement is Qwen3.5's by default: full attention at every fourth layer (its ``full_attention_interval=4``:
layers 3, 7, ..., so 7 of SmolLM2's 30), Gated DeltaNet in the others; or the layers a caller names
(``attention_layers``: a placement chosen where the teacher retrieves, ``benchmarks/teacher_layer_split.py``).
:func:`resplit` moves the attention of an already distilled hybrid to other layers. What carries over, and how:

- embeddings (tied), MLPs: copied. RMSNorms: Qwen3.5's norms scale by ``1 + w`` where Llama's scale by ``w``, so
  ``w`` is stored as ``w_teacher - 1`` (converted, not retrained; equal up to float rounding).
- kept attention layers: ``v_proj`` copied; ``q_proj``'s output-gate rows zero, so every gate is sigmoid(0) = 1/2,
  which ``o_proj`` (the teacher's, doubled) undoes exactly; rotary over the whole head (``partial_rotary_factor=1.0``,
  θ the teacher's): SmolLM2 rotates every dimension, and a partial rotary would change the attention pattern of
  every head. Qwen3.5 normalises q and k per head (``q_norm``, ``k_norm``), which Llama does not, and a per-token
  norm is what the teacher's retrieval reads: with every head's q and k RMS-normalised to their mean scale in its 8
  retrieval layers, the teacher answers 0 of 20 NIAH questions it answers 17 of 20 of (docs/hybrid/qk-norm.md).
  So the conversion puts q and k in the norm's **linear regime**: the query rows of ``q_proj`` and ``k_proj`` are the
  teacher's times a small ``c`` (:func:`linear_regime_scale`: their typical mean square ``c² E[q²]`` at
  :data:`LINEAR_REGIME` of the norm's ``eps``), so ``x · rsqrt(mean(x²) + eps)`` is ``x / sqrt(eps)`` within a
  relative 1e-4 for a typical token, and the norm's scale ``1 + w = sqrt(eps) / c`` undoes ``c``: the kept layer
  computes the teacher's attention, norms included (``tests/model/test_distill.py``). Training must then move those
  rows at ``c`` times the rate of the others (:mod:`hybridmodel.linear_regime`).
- GDN layers from the attention they replace: the 3 key heads take the teacher's 3 KV heads' keys and the mean of
  each group's 3 query heads; the 9 value heads repeat the teacher's 3 value heads (value head h reads key head
  h // 3, the teacher's GQA grouping); ``out_proj`` is the teacher's ``o_proj``. The short convolution starts as a
  pass-through of the current token, scaled by :data:`CONV_TAP` so that the SiLU after it is near-linear (q and k
  are L2-normalised and the output RMS-normalised, so the scale is invisible). Decay: ``init_gdn_decay`` (the
  Mamba2 / GDN recipe the default model uses); β starts at 1/2 (``in_proj_b`` zero), the output gate ``in_proj_z``
  at transformers' initialisation.
"""

from __future__ import annotations

import math

import torch
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

from .train import init_gdn_decay

CONV_TAP = 0.25
"""The pass-through tap of each GDN layer's short convolution at initialisation."""

LINEAR_REGIME = 1e-4
"""A converted attention layer's typical per-head mean square of q (and of k), as a fraction of its RMS norm's
``eps``: small enough that the norm is linear for tokens up to ~30x the typical RMS (1 % error there), large enough
to stay far above float32's and bfloat16's smallest normal numbers."""


def attention_placement(num_layers: int, attention_layers: tuple[int, ...] = ()) -> tuple[int, ...]:
    """The full-attention layers: ``attention_layers`` if given, else Qwen3.5's every fourth (3, 7, ...)."""
    return tuple(attention_layers) or tuple(range(3, num_layers, 4))


def hybrid_config(teacher_config, attention_layers: tuple[int, ...] = ()) -> Qwen3_5TextConfig:
    """The teacher's sizes in Qwen3.5's text architecture, full attention at :func:`attention_placement`."""
    t = teacher_config
    kept = attention_placement(t.num_hidden_layers, attention_layers)
    heads, kv_heads = t.num_attention_heads, t.num_key_value_heads
    head_dim = getattr(t, "head_dim", None) or t.hidden_size // heads
    rope_theta = (t.rope_parameters or {}).get("rope_theta", getattr(t, "rope_theta", 10000.0))
    half = head_dim // 2  # mrope sections cover the rotary frequencies; text positions are equal in all three
    sections = [half - 2 * (half // 3), half // 3, half // 3]
    return Qwen3_5TextConfig(
        vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
        num_hidden_layers=t.num_hidden_layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=head_dim, linear_num_key_heads=kv_heads, linear_num_value_heads=heads,
        linear_key_head_dim=head_dim, linear_value_head_dim=head_dim, linear_conv_kernel_dim=4,
        max_position_embeddings=t.max_position_embeddings,
        layer_types=["full_attention" if i in kept else "linear_attention" for i in range(t.num_hidden_layers)],
        rms_norm_eps=t.rms_norm_eps, tie_word_embeddings=t.tie_word_embeddings, hidden_act=t.hidden_act,
        bos_token_id=t.bos_token_id, eos_token_id=t.eos_token_id, pad_token_id=t.pad_token_id,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta, "partial_rotary_factor": 1.0,
                         "mrope_section": sections, "mrope_interleaved": True},
    )


@torch.no_grad()
def qk_mean_squares(teacher, sample_ids: torch.Tensor) -> dict[int, tuple[float, float]]:
    """``{layer: (typical mean square of q, of k)}``: the median over tokens and heads of each head's mean square
    of the teacher's q and k on ``sample_ids`` ``[1, n]`` (before RoPE, which preserves norms)."""
    scales, hooks = {}, []
    for index, layer in enumerate(teacher.model.layers):
        attention = layer.self_attn

        def record(module, args, kwargs, index=index, attention=attention):
            x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            q = attention.q_proj(x).unflatten(-1, (-1, attention.head_dim))
            k = attention.k_proj(x).unflatten(-1, (-1, attention.head_dim))
            scales[index] = (q.pow(2).mean(-1).median().item(), k.pow(2).mean(-1).median().item())

        hooks.append(attention.register_forward_pre_hook(record, with_kwargs=True))
    try:
        teacher(sample_ids)
    finally:
        for hook in hooks:
            hook.remove()
    return scales


@torch.no_grad()
def from_teacher(teacher, sample_ids: torch.Tensor, seed: int = 0,
                 attention_layers: tuple[int, ...] = ()) -> Qwen3_5ForCausalLM:
    """The hybrid of the module docstring, float32.

    Parameters
    ----------
    teacher : LlamaForCausalLM
        The pretrained teacher (left unchanged).
    sample_ids : torch.LongTensor
        ``[1, n]`` text on which q/k scales are measured.
    seed : int
        Seeds the GDN decay draw and the layers the teacher does not determine.
    attention_layers : tuple of int
        The full-attention layers (:func:`attention_placement`; empty: Qwen3.5's every fourth).
    """
    torch.manual_seed(seed)
    student = Qwen3_5ForCausalLM(hybrid_config(teacher.config, attention_layers)).float().eval()
    init_gdn_decay(student, torch.Generator().manual_seed(seed))
    carry_over(student, teacher)
    scales = qk_mean_squares(teacher, sample_ids)
    for index, (ours, theirs) in enumerate(zip(student.model.layers, teacher.model.layers)):
        if hasattr(ours, "self_attn"):
            convert_attention(ours.self_attn, theirs.self_attn, scales[index])
        else:
            _gdn_from(ours.linear_attn, theirs.self_attn)
    return student


def attention_layers_of(model) -> tuple[int, ...]:
    """The full-attention layers of a Qwen3.5 hybrid."""
    return tuple(i for i, layer in enumerate(model.model.layers) if hasattr(layer, "self_attn"))


def resplit(student, teacher, attention_layers: tuple[int, ...], sample_ids: torch.Tensor,
            seed: int = 0, fresh_attention: bool = False) -> tuple[Qwen3_5ForCausalLM, tuple[int, ...]]:
    """``student`` (a distilled hybrid) with its full attention moved to ``attention_layers``: the conversion of
    :func:`from_teacher` with that placement, in which every layer of the same kind in both placements takes
    ``student``'s trained mixer back (with ``fresh_attention``, its GDN layers only: every attention layer is the
    teacher's, converted anew). A layer that becomes GDN keeps its conversion and must be trained again
    (attention transfer on those layers).

    Returns
    -------
    tuple
        The new hybrid (float32) and the layers that became GDN.
    """
    moved = from_teacher(teacher, sample_ids, seed, attention_layers)
    fresh = []
    with torch.no_grad():
        for index, (ours, before) in enumerate(zip(moved.model.layers, student.model.layers)):
            kind = "self_attn" if hasattr(ours, "self_attn") else "linear_attn"
            if hasattr(before, kind) and not (fresh_attention and kind == "self_attn"):
                getattr(ours, kind).load_state_dict(getattr(before, kind).state_dict())
            elif kind == "linear_attn":
                fresh.append(index)
    return moved, tuple(fresh)


@torch.no_grad()
def carry_over(student, teacher) -> None:
    """Copy what the hybrid keeps of the teacher exactly: embeddings, MLPs and norms (``w - 1``)."""
    student.model.embed_tokens.weight.copy_(teacher.model.embed_tokens.weight)
    student.model.norm.weight.copy_(teacher.model.norm.weight - 1)
    if not student.config.tie_word_embeddings:
        student.lm_head.weight.copy_(teacher.lm_head.weight)
    for ours, theirs in zip(student.model.layers, teacher.model.layers):
        ours.input_layernorm.weight.copy_(theirs.input_layernorm.weight - 1)
        ours.post_attention_layernorm.weight.copy_(theirs.post_attention_layernorm.weight - 1)
        ours.mlp.load_state_dict(theirs.mlp.state_dict())


def linear_regime_scale(mean_square: float, eps: float) -> float:
    """The factor ``c`` that puts activations of typical mean square ``mean_square`` at :data:`LINEAR_REGIME` of an
    RMS norm's ``eps`` (``c² · mean_square = LINEAR_REGIME · eps``)."""
    return math.sqrt(LINEAR_REGIME * eps / mean_square)


@torch.no_grad()
def convert_attention(ours, theirs, mean_squares: tuple[float, float]) -> None:
    """Write the teacher's attention ``theirs`` (Llama) into the hybrid's gated attention ``ours`` (Qwen3.5), q and k
    in the linear regime of its norms (module docstring); ``mean_squares``: the typical mean square of the
    teacher's q and k per head in this layer (:func:`qk_mean_squares`)."""
    d = theirs.head_dim
    c_q = linear_regime_scale(mean_squares[0], ours.q_norm.eps)
    c_k = linear_regime_scale(mean_squares[1], ours.k_norm.eps)
    query = c_q * theirs.q_proj.weight.unflatten(0, (-1, d))  # [heads, d, hidden]
    ours.q_proj.weight.copy_(torch.cat([query, torch.zeros_like(query)], dim=1).flatten(0, 1))
    ours.k_proj.weight.copy_(c_k * theirs.k_proj.weight)
    ours.v_proj.weight.copy_(theirs.v_proj.weight)
    ours.o_proj.weight.copy_(2 * theirs.o_proj.weight)  # sigmoid(0) = 1/2 on every gate
    ours.q_norm.weight.fill_(math.sqrt(ours.q_norm.eps) / c_q - 1)  # the norm's scale 1 + w undoes c
    ours.k_norm.weight.fill_(math.sqrt(ours.k_norm.eps) / c_k - 1)


def _gdn_from(ours, theirs) -> None:
    d, key_heads = theirs.head_dim, ours.num_k_heads
    group = ours.num_v_heads // key_heads
    query = theirs.q_proj.weight.unflatten(0, (key_heads, group, d)).mean(1).flatten(0, 1)
    key = theirs.k_proj.weight
    value = theirs.v_proj.weight.unflatten(0, (key_heads, d)).repeat_interleave(group, 0).flatten(0, 1)
    ours.in_proj_qkv.weight.copy_(torch.cat([query, key, value]))
    ours.out_proj.weight.copy_(theirs.o_proj.weight)
    ours.conv1d.weight.zero_()
    ours.conv1d.weight[:, 0, -1] = CONV_TAP
    ours.in_proj_b.weight.zero_()
    ours.in_proj_a.weight.zero_()

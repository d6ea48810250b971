"""vLLM's GDN layers and its CPU GDN op (:mod:`serving.vllm_internals`): the layers and the op's split and gating that
the signal recorders wrap; the CPU kernels' limits, and the routing of the layers they refuse to the pure-torch path
(:mod:`serving.gdn_torch`) while the engine is built; what that path reads and writes of a layer: its projections, its
output, the sequences of the step, its state slots.
"""

from __future__ import annotations

import contextlib

import torch
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention

from .runner import layer_index


def gdn_layers(model) -> dict[int, torch.nn.Module]:
    """The GDN layer modules of a vLLM model (those with ``rearrange_mixed_qkv``, which the CPU op calls) by decoder
    layer index."""
    return {layer_index(m): m for m in model.modules()
            if hasattr(m, "rearrange_mixed_qkv") and getattr(m, "prefix", "")}


def wrap_gdn_rearrange(layer, wrap) -> None:
    """Replace, on this GDN layer instance, the split of the convolved ``mixed_qkv`` into ``(query, key, value)``
    that the CPU op calls (``rearrange_mixed_qkv``) by ``wrap(split)``."""
    layer.rearrange_mixed_qkv = wrap(layer.rearrange_mixed_qkv)


def gdn_core_shape(layer, tokens: int) -> tuple[int, int, int]:
    """``(tokens, Hv, dv)``: the shape of a GDN layer's core output for ``tokens`` tokens."""
    return tokens, layer.num_v_heads, layer.head_v_dim


def wrap_gdn_gating(wrap) -> None:
    """Replace, once per process, the gating kernel the CPU GDN op looks up (``fused_gdn_gating_cpu``, returning
    ``(g, beta)`` of the prefill tokens) by ``wrap(kernel)``; the op's module reads the name at every call."""
    import vllm._custom_ops as ops

    if not getattr(ops.fused_gdn_gating_cpu, "_hybridpress", False):
        wrapped = wrap(ops.fused_gdn_gating_cpu)
        wrapped._hybridpress = True
        ops.fused_gdn_gating_cpu = wrapped


CPU_GDN_HEAD_DIMS = (64, 128)
"""GDN key and value head dims vLLM 0.32's CPU chunked delta-rule kernel accepts."""
CPU_GDN_DTYPES = (torch.bfloat16,)
"""What vLLM 0.32's CPU GDN op computes in (it asserts bfloat16)."""


def cpu_gdn_kernels_run(layer, dtype: torch.dtype) -> bool:
    """Whether vLLM's CPU GDN kernels run ``layer`` (a ``QwenGatedDeltaNetAttention``) in ``dtype``."""
    return (dtype in CPU_GDN_DTYPES and layer.head_k_dim in CPU_GDN_HEAD_DIMS
            and layer.head_v_dim in CPU_GDN_HEAD_DIMS)


@contextlib.contextmanager
def torch_gdn_where_kernels_refuse(forward):
    """While the engine is built, route the CPU forward of every GDN layer the CPU kernels reject (head dims, dtype:
    :func:`cpu_gdn_kernels_run`) to ``forward(layer, hidden_states)``; the others keep vLLM's.

    A layer binds its forward method when it is built, so the layers of this engine keep the routing and the class
    is restored afterwards (other engines in the process are unchanged).
    """
    original = QwenGatedDeltaNetAttention.forward_cpu

    def forward_cpu(layer, hidden_states):
        if cpu_gdn_kernels_run(layer, hidden_states.dtype):
            return original(layer, hidden_states)
        return forward(layer, hidden_states)

    QwenGatedDeltaNetAttention.forward_cpu = forward_cpu
    try:
        yield
    finally:
        QwenGatedDeltaNetAttention.forward_cpu = original


def gdn_projections(layer, hidden_states: torch.Tensor):
    """The input projections of vLLM's GDN ``forward_cpu``: pre-conv ``mixed_qkv [T, C]``, gate ``z [T, Hv, dv]``,
    ``b`` and ``a`` ``[T, Hv]``."""
    mixed_qkvz, _ = layer.in_proj_qkvz(hidden_states)
    ba, _ = layer.in_proj_ba(hidden_states)
    if layer.gqa_interleaved_layout:  # Qwen3-Next's interleaved checkpoints
        query, key, value, z, b, a = layer.fix_query_key_value_ordering(mixed_qkvz, ba)
        mixed_qkv = torch.cat([t.reshape(t.shape[0], -1) for t in (query, key, value)], dim=-1)
        return mixed_qkv, z, b, a
    mixed_qkv, z = mixed_qkvz.split([2 * layer.key_dim + layer.value_dim, layer.value_dim], dim=-1)
    b, a = ba.chunk(2, dim=-1)
    return mixed_qkv, z.reshape(z.shape[0], -1, layer.head_v_dim), b, a


def gdn_output(layer, core: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The gated norm and output projection of vLLM's GDN layer over the core output ``[T, Hv, dv]``."""
    return layer._output_projection(core, z)


def gdn_sequences(layer) -> list[tuple[int, int, int, bool, bool]] | None:
    """The sequences of this step at a GDN layer: ``(first token, end, state slot, resumes from the slot's state,
    is a prefill)``, decodes first as vLLM orders them; None when the step has no GDN metadata (a profiling run)."""
    metadata = get_forward_context().attn_metadata
    metadata = None if metadata is None else metadata[layer.prefix]
    if metadata is None or metadata.num_actual_tokens == 0:
        return None
    if metadata.spec_sequence_masks is not None or metadata.num_spec_decodes:
        raise RuntimeError("speculative decoding reached the pure-torch GDN path; CompactingLLM refuses "
                           "speculative_config (serving.rules.check_engine_args)")
    starts = metadata.non_spec_query_start_loc.tolist()
    slots = metadata.non_spec_state_indices_tensor.tolist()
    resumes = (metadata.has_initial_state.tolist() if metadata.has_initial_state is not None
               else [True] * len(slots))
    decodes = metadata.num_decodes
    return [(starts[i], starts[i + 1], slots[i], i < decodes or bool(resumes[i]), i >= decodes)
            for i in range(decodes + metadata.num_prefills)]


def gdn_state_views(layer) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of a GDN layer's state slots: conv ``[slots, C, kernel - 1]`` and recurrent ``[slots, Hv, dk, dv]``
    (the CPU op reads the recurrent slots in this order)."""
    conv, recurrent = layer.kv_cache[0], layer.kv_cache[1]
    if not _conv_state_dim_first():
        conv = conv.transpose(-1, -2)
    slots, heads, v_dim, k_dim = recurrent.shape
    return conv, recurrent.view(slots, heads, k_dim, v_dim)


def gdn_conv_weight(layer) -> torch.Tensor:
    """The ``[C, 1, kernel]`` conv weight (vLLM packs it in place for its bfloat16 CPU conv and keeps a copy)."""
    unpacked = getattr(layer.conv1d, "_cpu_unpacked_conv_weight", None)
    return layer.conv1d.weight if unpacked is None else unpacked[:, None, :]


def _conv_state_dim_first() -> bool:
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    return is_conv_state_dim_first()

"""Gated DeltaNet forward that continues from cached conv and recurrent states.

transformers 5.2 runs a multi-token chunk from ``initial_state=None`` and rebuilds the conv state from the
new tokens only, so a question appended to a cached context loses the recurrent memory. This module runs
the same math as the model's GDN layer (Eq. 1 of the paper) for a chunk of any length, starting from the
states it is given, and optionally records the native signals (β, g, ‖v‖) handed to the delta rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .fused_kernels import fla_gated_delta_rule, uses_fla


@dataclass
class RecurrentState:
    """Fixed-size recurrent memory of one GDN or Mamba2 layer (batch of one).

    Attributes
    ----------
    conv : torch.Tensor
        ``[conv_dim, kernel]``: the last ``kernel`` inputs of the short convolution.
    recurrent : torch.Tensor
        ``[num_v_heads, head_k_dim, head_v_dim]`` float32 delta-rule state S_t.
    """

    conv: torch.Tensor
    recurrent: torch.Tensor

    def clone(self) -> "RecurrentState":
        return RecurrentState(self.conv.clone(), self.recurrent.clone())

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.recurrent.nbytes


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    # Same epsilon placement as FLA / transformers, so outputs match bit for bit in float32.
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def chunk_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked gated delta rule from a given initial state.

    Parameters
    ----------
    query, key : torch.Tensor
        ``[..., H, L, dk]``, already L2-normalised (any leading batch dims).
    value : torch.Tensor
        ``[..., H, L, dv]``.
    g, beta : torch.Tensor
        ``[..., H, L]`` log-decay and write gate.
    initial_state : torch.Tensor
        ``[..., H, dk, dv]``.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        Output ``[..., H, L, dv]`` (float32) and final state ``[..., H, dk, dv]``.
    """
    query, key, value, g, beta = (t.float() for t in (query, key, value, g, beta))
    *lead, length, dk = key.shape
    pad = (chunk_size - length % chunk_size) % chunk_size
    query, key, value = (F.pad(t, (0, 0, 0, pad)) for t in (query, key, value))
    g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    chunks = (length + pad) // chunk_size

    query = query * dk**-0.5
    k_beta = key * beta.unsqueeze(-1)
    v_beta = value * beta.unsqueeze(-1)
    query, key, k_beta, v_beta = (t.reshape(*lead, chunks, chunk_size, -1) for t in (query, key, k_beta, v_beta))
    g = g.reshape(*lead, chunks, chunk_size).cumsum(-1)
    decay = (g.unsqueeze(-1) - g.unsqueeze(-2)).tril().exp().tril()

    # Within a chunk the WY representation needs (I + A)^-1 with A strictly lower triangular;
    # an exact triangular solve replaces transformers' row-by-row Python loop.
    strict = (k_beta @ key.transpose(-1, -2) * decay).tril(-1)
    eye = torch.eye(chunk_size, dtype=strict.dtype, device=strict.device)
    wy = torch.linalg.solve_triangular(eye + strict, eye.expand_as(strict), upper=False)
    value_wy = wy @ v_beta
    k_cumdecay = wy @ (k_beta * g.exp().unsqueeze(-1))

    state = initial_state.float()
    outs = []
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=value.device).triu(1)
    for c in range(chunks):
        q_c, k_c, g_c = query[..., c, :, :], key[..., c, :, :], g[..., c, :]
        intra = (q_c @ k_c.transpose(-1, -2) * decay[..., c, :, :]).masked_fill(causal, 0)
        v_new = value_wy[..., c, :, :] - k_cumdecay[..., c, :, :] @ state
        outs.append((q_c * g_c.unsqueeze(-1).exp()) @ state + intra @ v_new)
        g_last = g_c[..., -1:]
        state = (state * g_last.unsqueeze(-1).exp()
                 + (k_c * (g_last - g_c).exp().unsqueeze(-1)).transpose(-1, -2) @ v_new)
    return torch.cat(outs, dim=-2)[..., :length, :], state


def recurrent_gated_delta_step(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token gated delta rule; same shapes as :func:`chunk_gated_delta_rule`."""
    query, key, value, g, beta = (t.float() for t in (query, key, value, g, beta))
    query = query * key.shape[-1] ** -0.5
    state = state.float()
    outs = []
    for t in range(key.shape[1]):
        state = state * g[:, t, None, None].exp()
        memory = (state * key[:, t, :, None]).sum(-2)
        delta = (value[:, t] - memory) * beta[:, t, None]
        state = state + key[:, t, :, None] * delta[:, None, :]
        outs.append((state * query[:, t, :, None]).sum(-2))
    return torch.stack(outs, dim=1), state


def gdn_forward(adapter, layer_idx: int, hidden: torch.Tensor, state: RecurrentState | None, record_signals: bool):
    """Run one GDN layer over a chunk, continuing from ``state``.

    Parameters
    ----------
    adapter : runtime.adapters.ModelAdapter
    layer_idx : int
    hidden : torch.Tensor
        ``[1, L, D]`` output of the layer's input norm.
    state : RecurrentState or None
        ``None`` starts from zeros (a fresh sequence).
    record_signals : bool
        Also return the native signals ``[L, num_v_heads, 3]`` = (β, g, ‖v‖), float32.

    Returns
    -------
    (torch.Tensor, RecurrentState, torch.Tensor or None)
        Layer output ``[1, L, D]``, the new state, the signals.
    """
    module = adapter.gdn_module(layer_idx)
    mixed_qkv, z, b, a = adapter.gdn_projections(layer_idx, hidden)
    core, state, signals = gdn_core(module, mixed_qkv[0], b[0], a[0], state, record_signals=record_signals)
    core = core.to(hidden.dtype).reshape(-1, module.head_v_dim)
    core = module.norm(core, z.reshape(-1, module.head_v_dim)).reshape(1, mixed_qkv.shape[-1], -1)
    return module.out_proj(core), state, signals


def gdn_core(module, mixed_qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, state: RecurrentState | None,
             conv_weight: torch.Tensor | None = None, record_signals: bool = False
             ) -> tuple[torch.Tensor, RecurrentState, torch.Tensor | None]:
    """The short convolution, the gates and the delta rule of one GDN layer over a chunk of one sequence.

    Shared by the runtime and the serving plugin's pure-torch GDN path, so both run the same numbers.

    Parameters
    ----------
    module : GDN layer
        Read for its sizes (``conv_kernel_size``, ``key_dim``, ``value_dim``, ``num_k_heads``, ``num_v_heads``,
        ``head_k_dim``, ``head_v_dim``) and parameters (``conv1d``, ``A_log``, ``dt_bias``): transformers' and
        vLLM's GDN layers both name them so.
    mixed_qkv : torch.Tensor
        ``[conv_dim, L]`` projected queries, keys and values before the convolution.
    b, a : torch.Tensor
        ``[L, num_v_heads]`` write-gate and decay projections.
    state : RecurrentState or None
        ``None`` starts from zeros. ``state.conv`` holds at least the last ``kernel - 1`` inputs ``[conv_dim, c]``.
    conv_weight : torch.Tensor, optional
        ``[conv_dim, 1, kernel]`` in place of ``module.conv1d.weight`` (where that is stored packed).
    record_signals : bool
        Also return the native signals.

    Returns
    -------
    (torch.Tensor, RecurrentState, torch.Tensor or None)
        Core output ``[L, num_v_heads, head_v_dim]`` float32 (before the gated norm), the new state (its ``conv``
        the last ``kernel`` inputs), and the signals ``[L, num_v_heads, 3]`` = (β, g, ‖v‖) float32 when asked.
    """
    conv_dim, length = mixed_qkv.shape
    kernel = module.conv_kernel_size
    weight = module.conv1d.weight if conv_weight is None else conv_weight
    previous = (torch.zeros(conv_dim, kernel, dtype=mixed_qkv.dtype, device=mixed_qkv.device) if state is None
                else state.conv.to(mixed_qkv.dtype))
    conv_input = torch.cat([previous, mixed_qkv], dim=-1)[None]
    mixed_qkv = F.silu(F.conv1d(conv_input, weight, module.conv1d.bias, groups=conv_dim)[..., -length:])
    new_conv = conv_input[0, :, -kernel:].clone()

    query, key, value = torch.split(mixed_qkv[0].transpose(0, 1),
                                    [module.key_dim, module.key_dim, module.value_dim], -1)
    query = query.reshape(length, module.num_k_heads, module.head_k_dim)
    key = key.reshape(length, module.num_k_heads, module.head_k_dim)
    value = value.reshape(length, module.num_v_heads, module.head_v_dim)
    beta = b.sigmoid()
    g = -module.A_log.float().exp() * F.softplus(a.float() + module.dt_bias)
    repeat = module.num_v_heads // module.num_k_heads
    if repeat > 1:
        query = query.repeat_interleave(repeat, dim=1)
        key = key.repeat_interleave(repeat, dim=1)
    query, key = _l2norm(query.float()), _l2norm(key.float())

    initial = (torch.zeros(module.num_v_heads, module.head_k_dim, module.head_v_dim, device=value.device)
               if state is None else state.recurrent)
    args = (query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1), g.transpose(0, 1), beta.transpose(0, 1))
    if uses_fla(value):
        core, recurrent = fla_gated_delta_rule(*args, initial)
    else:
        kernel_fn = recurrent_gated_delta_step if length == 1 else chunk_gated_delta_rule
        core, recurrent = kernel_fn(*args, initial)
    signals = torch.stack([beta.float(), g.float(), value.float().norm(dim=-1)], dim=-1) if record_signals else None
    return core.transpose(0, 1), RecurrentState(new_conv, recurrent), signals


def transformers_chunk_kernel(query, key, value, g, beta, chunk_size=64, initial_state=None,
                              output_final_state=False, use_qk_l2norm_in_kernel=False):
    """Drop-in for transformers' ``torch_chunk_gated_delta_rule`` (``[B, L, H, d]`` layout), for training.

    Install it on one model's GDN modules (``module.chunk_gated_delta_rule = transformers_chunk_kernel``), never
    globally: the exact triangular solve is several times faster than transformers' Python loop.
    """
    dtype = query.dtype
    if use_qk_l2norm_in_kernel:
        query, key = _l2norm(query.float()), _l2norm(key.float())
    query, key, value = (t.transpose(1, 2) for t in (query, key, value))
    g, beta = g.transpose(1, 2), beta.transpose(1, 2)
    batch, heads, _, dk = key.shape
    state = (torch.zeros(batch, heads, dk, value.shape[-1], device=value.device)
             if initial_state is None else initial_state)
    out, state = chunk_gated_delta_rule(query, key, value, g, beta, state, chunk_size)
    return out.transpose(1, 2).to(dtype), (state if output_final_state else None)

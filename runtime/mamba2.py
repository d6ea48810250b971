"""Mamba2 mixer forward that continues from cached conv and SSM states (Bamba, Granite 4.0-H, Falcon-H1).

transformers 5.2's torch path (``torch_forward`` of ``BambaMixer`` and its copies) runs a multi-token chunk from a
zero SSM state and rebuilds the conv state from the new tokens only; only a single token continues from the cache.
So a question appended to a cached context would lose the recurrent memory. This module runs the same math for a
chunk of any length, starting from the states it is given: the short causal convolution over the cached inputs
followed by the chunked state-space-duality scan (SSD) of Mamba2,

    h_t = exp(Δ_t · A) h_{t-1} + Δ_t · x_t ⊗ B_t,        y_t = h_t C_t + D · x_t,

per head, with Δ_t = softplus(dt_t + dt_bias) clamped to the mixer's ``time_step_limit``.

The state of a layer is a :class:`~runtime.gdn.RecurrentState` (``conv``: the last ``kernel`` conv inputs;
``recurrent``: the SSM state): a fork, a question's branch and a batch of children copy and stack it exactly as they
do a GDN layer's, so nothing of theirs distinguishes the two recurrent kinds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .fused_kernels import mamba_ssm_scan, uses_mamba_ssm
from .gdn import RecurrentState


def _segment_sum(log_decay: torch.Tensor) -> torch.Tensor:
    """``[..., l]`` -> ``[..., l, l]``: entry ``[t, s]`` is Σ_{s<r≤t} ``log_decay[r]``, −inf above the diagonal.

    Summed from masked copies, as transformers' ``segment_sum`` does, rather than as a difference of cumulative sums:
    the cumulative sums of a long chunk reach hundreds, where their difference would lose float32 digits.
    """
    length = log_decay.shape[-1]
    expanded = log_decay[..., None].expand(*log_decay.shape, length)  # [..., r, s] = log_decay[r]
    lower = torch.ones(length, length, dtype=torch.bool, device=log_decay.device).tril()
    summed = expanded.masked_fill(~lower.tril(-1), 0).cumsum(-2)
    return summed.masked_fill(~lower, float("-inf"))


def ssd_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    initial_state: torch.Tensor,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked Mamba2 scan (SSD) from a given SSM state; the D skip term is left to the caller.

    Parameters
    ----------
    x : torch.Tensor
        ``[L, H, P]`` post-conv inputs, float32.
    dt : torch.Tensor
        ``[L, H]`` discretisation steps Δ (after softplus and clamping), float32.
    A : torch.Tensor
        ``[H]`` negative decay rates, float32.
    B, C : torch.Tensor
        ``[L, H, N]`` input and output projections, already repeated from groups to heads, float32.
    initial_state : torch.Tensor
        ``[H, P, N]`` float32 SSM state before the first token.
    chunk_size : int
        Tokens per scan chunk (the mixer's ``chunk_size``); a chunk of any length L is accepted.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        ``y`` ``[L, H, P]`` without the D term, and the state ``[H, P, N]`` after the last token.
    """
    log_decay = dt * A  # [L, H]
    x_dt = x * dt[..., None]
    state = initial_state
    outputs = []
    for start in range(0, x.shape[0], chunk_size):
        span = slice(start, start + chunk_size)
        a = log_decay[span].transpose(0, 1)  # [H, l]
        cumulative = a.cumsum(-1)
        b, c, xc = B[span], C[span], x_dt[span]
        # within the chunk: attention-like weights C_t·B_s, decayed from s to t (diagonal blocks)
        weights = torch.einsum("thn,shn->hts", c, b) * _segment_sum(a).exp()
        y = torch.einsum("hts,shp->thp", weights, xc)
        # from the state entering the chunk, decayed to each token (off-diagonal blocks)
        y = y + torch.einsum("thn,hpn->thp", c, state) * cumulative.exp().transpose(0, 1)[..., None]
        to_end = (cumulative[:, -1:] - cumulative).exp()  # [H, l]
        state = state * cumulative[:, -1].exp()[:, None, None] + torch.einsum("shn,hs,shp->hpn", b, to_end, xc)
        outputs.append(y)
    return torch.cat(outputs), state


def mamba2_forward(adapter, layer_idx: int, hidden: torch.Tensor, state: RecurrentState | None,
                   record_signals: bool = False):
    """Run one Mamba2 mixer over a chunk, continuing from ``state``; optionally record its GateSight signals.

    Parameters
    ----------
    adapter : runtime.adapters.ModelAdapter
        Provides :meth:`mamba_module`, :meth:`mamba_projections` and :meth:`mamba_output`.
    layer_idx : int
    hidden : torch.Tensor
        ``[1, L, D]`` output of the layer's input norm.
    state : RecurrentState or None
        ``conv`` ``[conv_dim, kernel]``, ``recurrent`` ``[H, P, N]`` float32; ``None`` starts from zeros.
    record_signals : bool
        Also return the Mamba2 analogues of GDN's (β, g, ‖v‖) per token and head, float32 ``[L, H, 3]``:
        the write strength Δ·‖B‖ (the state gains Δ·‖B‖ · x ⊗ B/‖B‖), the log-decay g = A·Δ (the state is
        multiplied by exp(g)), and ‖x‖ (the written content), each exactly as the scan consumes them.

    Returns
    -------
    (torch.Tensor, RecurrentState, torch.Tensor or None)
        The mixer's contribution to the residual stream ``[1, L, D]``, the new state, the signals.
    """
    module = adapter.mamba_module(layer_idx)
    gate, xbc, dt = adapter.mamba_projections(layer_idx, hidden)  # [1, L, I], [1, L, conv_dim], [1, L, H]
    length, kernel = xbc.shape[1], module.conv_kernel_size
    xbc = xbc.transpose(1, 2)
    previous = (torch.zeros(1, module.conv_dim, kernel, dtype=xbc.dtype, device=xbc.device)
                if state is None else state.conv.unsqueeze(0).to(xbc.dtype))
    conv_input = torch.cat([previous, xbc], dim=-1)
    conv = F.conv1d(conv_input, module.conv1d.weight, module.conv1d.bias, groups=module.conv_dim)
    xbc = module.act(conv[..., -length:])
    new_conv = conv_input[0, :, -kernel:].clone()

    groups_state = module.n_groups * module.ssm_state_size
    x, B, C = torch.split(xbc[0].transpose(0, 1), [module.intermediate_size, groups_state, groups_state], dim=-1)
    heads, repeat = module.num_heads, module.num_heads // module.n_groups
    x = x.reshape(length, heads, module.head_dim).float()
    B = B.reshape(length, module.n_groups, module.ssm_state_size).float().repeat_interleave(repeat, dim=1)
    C = C.reshape(length, module.n_groups, module.ssm_state_size).float().repeat_interleave(repeat, dim=1)
    # Δ in the model's dtype, as transformers computes it, then float32 for the scan
    dt = torch.clamp(F.softplus(dt[0] + module.dt_bias), *module.time_step_limit).float()
    A = -torch.exp(module.A_log.float())
    initial = (torch.zeros(heads, module.head_dim, module.ssm_state_size, device=x.device)
               if state is None else state.recurrent)
    scan = mamba_ssm_scan if uses_mamba_ssm(x) else ssd_scan
    y, recurrent = scan(x, dt, A, B, C, initial, module.chunk_size)
    y = y + module.D.float()[:, None] * x
    signals = torch.stack([dt * B.norm(dim=-1), dt * A, x.norm(dim=-1)], dim=-1) if record_signals else None
    return adapter.mamba_output(layer_idx, y.reshape(1, length, -1), gate), RecurrentState(new_conv, recurrent), signals

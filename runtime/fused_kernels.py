"""The field's fused scan kernels for the recurrent layers on CUDA, chosen automatically where installed.

On a CUDA device the runtime runs GDN layers with flash-linear-attention's ``chunk_gated_delta_rule`` (Triton; it
takes an ``initial_state`` and returns the final state) and Mamba2 mixers with mamba-ssm's
``mamba_chunk_scan_combined``, when those packages are importable (``pip install "hybridpress[cuda]"``); everywhere
else, and with ``HYBRIDPRESS_KERNELS=torch``, the pure-torch kernels of :mod:`runtime.gdn` and
:mod:`runtime.mamba2`, which define the numbers: ``tests/runtime/test_fused_kernels.py`` checks each fused kernel
against them on a GPU (skipped, with the reason, where there is none).

Both wrappers take and return this project's layout (one sequence, heads first) and float32 states.
"""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache

import torch

from .errors import UsageError

KERNELS_VARIABLE = "HYBRIDPRESS_KERNELS"
"""``torch`` forces the pure-torch kernels on every device; unset or ``auto``: fused kernels on CUDA if installed."""
KERNEL_CHOICES = ("auto", "torch")
"""What :data:`KERNELS_VARIABLE` takes."""


@lru_cache(maxsize=None)
def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def kernel_choice() -> str:
    """:data:`KERNELS_VARIABLE`'s value, ``auto`` where it is unset; a :class:`~runtime.errors.UsageError` naming any
    other value (empty too) and what is allowed. ``bench`` reads it as a command that loads a model starts, so that a
    mistyped value is one line before any work, not an error inside the first prefill (probe 14)."""
    choice = os.environ.get(KERNELS_VARIABLE, "auto")
    if choice not in KERNEL_CHOICES:
        raise UsageError(f"{KERNELS_VARIABLE}={choice!r}: expected {' or '.join(KERNEL_CHOICES)} (auto: the "
                         "fused kernels on CUDA where installed; torch: the pure-torch kernels everywhere), or leave "
                         "it unset")
    return choice


def _wanted(tensor: torch.Tensor, package: str) -> bool:
    choice = kernel_choice()
    # a padded batch of children (runtime.batch) runs the layer loop under vmap, which a Triton kernel cannot join
    batched = torch._C._functorch.is_batchedtensor(tensor)
    return choice == "auto" and tensor.is_cuda and not batched and _installed(package)


def uses_fla(tensor: torch.Tensor) -> bool:
    """Whether GDN layers on ``tensor``'s device run flash-linear-attention's kernel."""
    return _wanted(tensor, "fla")


def uses_mamba_ssm(tensor: torch.Tensor) -> bool:
    """Whether Mamba2 mixers on ``tensor``'s device run mamba-ssm's kernel."""
    return _wanted(tensor, "mamba_ssm")


def fla_gated_delta_rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                         beta: torch.Tensor, initial_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`runtime.gdn.chunk_gated_delta_rule` by flash-linear-attention (same arguments and results:
    ``[H, L, d]`` inputs, L2-normalised query and key, ``[H, L]`` log-decay and write gate, ``[H, dk, dv]`` state)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    def tokens_first(t: torch.Tensor) -> torch.Tensor:  # [H, L, ...] -> [1, L, H, ...]
        return t.transpose(0, 1).unsqueeze(0).float().contiguous()

    out, state = chunk_gated_delta_rule(tokens_first(query), tokens_first(key), tokens_first(value),
                                        g=tokens_first(g), beta=tokens_first(beta), scale=key.shape[-1] ** -0.5,
                                        initial_state=initial_state.float().unsqueeze(0).contiguous(),
                                        output_final_state=True)
    return out[0].transpose(0, 1).float(), state[0].float()


def mamba_ssm_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   initial_state: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`runtime.mamba2.ssd_scan` by mamba-ssm (same arguments and results: ``[L, H, P]`` inputs, Δ after
    softplus and clamping, ``B`` and ``C`` per head, ``[H, P, N]`` state; no D term)."""
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    y, state = mamba_chunk_scan_combined(x[None].float().contiguous(), dt[None].float().contiguous(), A.float(),
                                         B[None].float().contiguous(), C[None].float().contiguous(), chunk_size,
                                         initial_states=initial_state[None].float().contiguous(),
                                         return_final_states=True)
    return y[0].float(), state[0].float()

"""The fused CUDA kernels of the recurrent layers (runtime.fused_kernels) against this project's pure-torch ones.

They run only on a GPU with flash-linear-attention / mamba-ssm installed (``pip install "hybridpress[cuda]"``,
``scripts/gpu_check.sh``); elsewhere these tests skip and say why. The choice of kernel is tested everywhere.
"""

import copy

import pytest
import torch

from runtime import prefill
from runtime.fused_kernels import KERNELS_VARIABLE, _installed, uses_fla, uses_mamba_ssm
from runtime.gdn import chunk_gated_delta_rule, recurrent_gated_delta_step
from runtime.mamba2 import ssd_scan

CUDA = torch.cuda.is_available()


def _needs(package: str):
    if not CUDA:
        pytest.skip("no CUDA device here: the fused kernels run on GPUs only (scripts/gpu_check.sh runs these)")
    if not _installed(package):
        pytest.skip(f"{package} is not installed: pip install 'hybridpress[cuda]'")


def test_pure_torch_kernels_on_cpu_and_when_forced(monkeypatch):
    cpu = torch.zeros(2)
    assert not uses_fla(cpu) and not uses_mamba_ssm(cpu)
    monkeypatch.setenv(KERNELS_VARIABLE, "fused")
    with pytest.raises(ValueError, match="HYBRIDPRESS_KERNELS='fused': expected auto or torch"):
        uses_fla(cpu)


def _gdn_inputs(heads, length, dk, dv, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=g).to(device)  # noqa: E731
    query = torch.nn.functional.normalize(rand(heads, length, dk), dim=-1)
    key = torch.nn.functional.normalize(rand(heads, length, dk), dim=-1)
    return (query, key, rand(heads, length, dv), -torch.rand(heads, length, generator=g).to(device) * 0.5,
            torch.rand(heads, length, generator=g).to(device), rand(heads, dk, dv) * 0.1)


@pytest.mark.parametrize("length", [1, 7, 64, 300])
def test_fla_gated_delta_rule_equals_the_torch_kernel(length):
    _needs("fla")
    from runtime.fused_kernels import fla_gated_delta_rule

    args = _gdn_inputs(4, length, 64, 32, "cuda", length)
    reference = recurrent_gated_delta_step if length == 1 else chunk_gated_delta_rule
    expected_out, expected_state = reference(*args)
    out, state = fla_gated_delta_rule(*args)
    torch.testing.assert_close(out, expected_out, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(state, expected_state, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("length", [1, 50, 300])
def test_mamba_ssm_scan_equals_the_torch_scan(length):
    _needs("mamba_ssm")
    from runtime.fused_kernels import mamba_ssm_scan

    g = torch.Generator().manual_seed(length)
    heads, head_dim, state_size = 4, 16, 32
    x = torch.randn(length, heads, head_dim, generator=g).cuda()
    dt = torch.rand(length, heads, generator=g).cuda() * 0.1
    A = -torch.rand(heads, generator=g).cuda()
    B, C = (torch.randn(length, heads, state_size, generator=g).cuda() for _ in range(2))
    initial = torch.randn(heads, head_dim, state_size, generator=g).cuda() * 0.1
    expected_y, expected_state = ssd_scan(x, dt, A, B, C, initial, 64)
    y, state = mamba_ssm_scan(x, dt, A, B, C, initial, 64)
    torch.testing.assert_close(y, expected_y, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(state, expected_state, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("family,package", [("qwen3_5", "fla"), ("bamba", "mamba_ssm")])
def test_a_model_on_the_fused_kernels_answers_as_on_the_torch_ones(tiny, monkeypatch, family, package):
    _needs(package)
    model = copy.deepcopy(tiny(family)).cuda()  # the fixture's model stays on the CPU for other tests
    ids = torch.randint(0, 97, (200,), generator=torch.Generator().manual_seed(0)).cuda()
    question = torch.arange(5, 12).cuda()
    fused = prefill(model, ids, protected=4).logits(question)
    monkeypatch.setenv(KERNELS_VARIABLE, "torch")
    plain = prefill(model, ids, protected=4).logits(question)
    torch.testing.assert_close(fused, plain, rtol=2e-3, atol=2e-3)

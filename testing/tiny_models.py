"""Tiny random models built from configs (no download): every one each adapter declares
(:meth:`runtime.ModelAdapter.tiny_configs`), initialised so that a wrong index, sign or lost state shows."""

from __future__ import annotations

import copy
import math
from functools import partial

import torch
from transformers import AutoModelForCausalLM

from runtime.adapters import ADAPTERS, ModelAdapter


def _tiny_configs() -> dict[str, tuple[type[ModelAdapter], type, dict]]:
    configs = {}
    for adapter in ADAPTERS:
        for name, (config_class, settings) in adapter.tiny_configs().items():
            if name in configs:
                raise RuntimeError(f"tiny model {name!r} is declared by both {configs[name][0].__name__} and "
                                   f"{adapter.__name__}")
            configs[name] = (adapter, config_class, settings)
    return configs


TINY_CONFIGS = _tiny_configs()
"""Tiny model name -> (the adapter that declares it, its config class, its settings)."""


def tiny_config(name: str, **change):
    """The config of tiny model ``name``; ``change`` replaces any of its settings (``num_hidden_layers=6``)."""
    _, config_class, settings = TINY_CONFIGS[name]
    return config_class(**{**copy.deepcopy(settings), **change})


def tiny_model(name: str, seed: int = 0, **change):
    """Tiny model ``name`` (:func:`tiny_config` with ``change``), its weights drawn from ``seed``, then its Mamba2
    steps set (:func:`mamba2_init`) and every weight perturbed (:func:`perturbed`); float32, in eval mode."""
    torch.manual_seed(seed)
    return mamba2_init(AutoModelForCausalLM.from_config(tiny_config(name, **change)))


MODELS = {name: partial(tiny_model, name) for name in TINY_CONFIGS}
"""Tiny model name -> its builder (``seed`` and config changes as keywords)."""


def perturbed(model):
    torch.manual_seed(1234)
    # random init leaves RMSNorm weights at their zero "(1 + w)" offset; perturb everything so that a wrong
    # index, sign or norm would show in the outputs
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.float().eval()


def mamba2_init(model):
    """Mamba2's own initialisation of the step Δ (log-uniform in [time_step_min, time_step_max] through an inverse
    softplus) in every Mamba2 mixer, then :func:`perturbed`: transformers' ``_init_weights`` sets ``dt_bias`` to 1,
    where every head forgets within a few tokens and a lost state would hardly show; with Δ ≥ 0.001 the slowest head
    keeps a half-life of hundreds of tokens."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in model.model.layers:
            mixer = getattr(layer, "mamba", None)
            if mixer is not None:
                low, high = math.log(mixer.time_step_min), math.log(mixer.time_step_max)
                dt = torch.exp(torch.rand(mixer.num_heads, generator=generator) * (high - low) + low)
                mixer.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
                # a small skip D, so that the gated norm's output is mostly the state's read-out C·h, not D·x
                mixer.D.fill_(0.1)
    return perturbed(model)

"""How long each GDN (or Mamba2) head of a model remembers, read from its weights alone.

The default model's training initialises the decays so that slow heads exist (:data:`hybridmodel.train.GDN_DT_RANGE`)
and logs these half-lives at every checkpoint; the GateSight analysis (``bench analyze``, observation 1) compares them
with the half-lives measured on text. Both read them here, so the training does not depend on the analysis.
"""

from __future__ import annotations

import math

import torch


def static_half_lives(model) -> dict[tuple[int, int], float]:
    """Memory half-life ln 2 / (exp(A_log) · softplus(dt_bias)) of every GDN value head at input a = 0, and of every
    Mamba2 head at input dt = 0 (its decay exp(−exp(A_log) · softplus(dt + dt_bias)) has the same form).

    Parameters
    ----------
    model : transformers causal LM
        A hybrid with ``model.model.layers``; the GDN layers carry ``linear_attn``, the Mamba2 layers ``mamba``, with
        ``A_log`` and ``dt_bias`` of shape ``[heads]``.

    Returns
    -------
    dict[tuple[int, int], float]
        ``{(layer index, head): half-life in tokens}`` over the GDN or Mamba2 layers.
    """
    out = {}
    for index, layer in enumerate(model.model.layers):
        module = getattr(layer, "linear_attn", None) or getattr(layer, "mamba", None)
        if module is not None:
            rate = module.A_log.float().exp() * torch.nn.functional.softplus(module.dt_bias.float())
            for head, r in enumerate(rate.tolist()):
                out[(index, head)] = math.log(2) / r
    return out

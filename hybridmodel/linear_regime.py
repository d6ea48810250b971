"""Training attention layers whose q and k sit in the linear regime of Qwen3.5's per-head RMS norms.

A converted attention layer (:func:`hybridmodel.from_teacher.convert_attention`) keeps the teacher's per-token q/k
norms by scaling the query rows of ``q_proj`` and all of ``k_proj`` by a small ``c`` (≈ 1e-5) and the norm's scale
``1 + w`` by ``1 / c``: the norm then computes ``x · (1 + w) / sqrt(eps)``, a linear map. The layer's output depends
on the *effective* weights ``u = W / c``; AdamW on ``W`` would move it by ~``lr`` a step — ~1e5 times too far — and
its gradients (``∂L/∂W = ∂L/∂u / c``) would swamp every other parameter's under a global norm clip. So those rows
are trained as ``u`` would be: gradients multiplied by ``c`` before clipping, each AdamW update multiplied by ``c``
after it (exactly AdamW on ``u`` without weight decay, which the distillation does not use).

A layer is in the regime where its q_norm input's mean square is far below ``eps`` (:data:`REGIME_BOUND`), measured
on each training window: a hybrid distilled before the regime existed (its norms saturated, ``mean(x²) ≫ eps``) is
trained as it always was.
"""

from __future__ import annotations

import math

import torch

REGIME_BOUND = 1e-2
"""A norm's input counts as in its linear regime where its mean square is below this fraction of ``eps``."""


class LinearRegimeSteps:
    """Per-row update scales for the q/k rows of ``model``'s attention layers in the linear regime.

    Use around each optimiser step::

        regime = LinearRegimeSteps(model)      # hooks every attention layer's q_norm and k_norm
        loss.backward(); regime.scale_gradients(); clip(...); regime.step(optimizer)
    """

    def __init__(self, model):
        self.blocks = []  # (weight, rows [slice or None], norm, measured mean squares)
        self.hooks = []
        for layer in model.model.layers:
            attention = getattr(layer, "self_attn", None)
            if attention is None or not hasattr(attention, "q_norm"):
                continue
            heads, d = attention.q_proj.weight.shape[0] // (2 * attention.head_dim), attention.head_dim
            query_rows = torch.arange(heads * 2 * d).view(heads, 2, d)[:, 0].flatten()  # q_proj: [query, gate]/head
            for weight, rows, norm in ((attention.q_proj.weight, query_rows, attention.q_norm),
                                       (attention.k_proj.weight, None, attention.k_norm)):
                seen: list[float] = []
                self.hooks.append(norm.register_forward_pre_hook(
                    lambda module, args, seen=seen: seen.append(args[0].detach().float().pow(2).mean().item())))
                self.blocks.append((weight, rows, norm, seen))

    def _scales(self):
        """``(weight, rows, c)`` for each block whose norm saw only linear-regime inputs since the last step."""
        for weight, rows, norm, seen in self.blocks:
            if seen and max(seen) < REGIME_BOUND * norm.eps and weight.requires_grad:
                yield weight, rows, math.sqrt(norm.eps) / (1.0 + norm.weight.detach().float()).mean().item()

    def scale_gradients(self) -> None:
        """``∂L/∂W → c · ∂L/∂W`` (= ∂L/∂u) on the regime's rows; call after ``backward``, before clipping."""
        for weight, rows, c in self._scales():
            if weight.grad is not None:
                target = weight.grad if rows is None else weight.grad[rows]
                scaled = target * c
                if rows is None:
                    weight.grad.copy_(scaled)
                else:
                    weight.grad[rows] = scaled

    @torch.no_grad()
    def step(self, optimizer) -> None:
        """``optimizer.step()`` with the update of the regime's rows multiplied by their ``c``."""
        scaled = list(self._scales())
        before = [(weight, rows, c, (weight if rows is None else weight[rows]).clone()) for weight, rows, c in scaled]
        optimizer.step()
        for weight, rows, c, old in before:
            new = weight if rows is None else weight[rows]
            value = old + c * (new - old)
            if rows is None:
                weight.copy_(value)
            else:
                weight[rows] = value
        for _, _, _, seen in self.blocks:
            seen.clear()

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()

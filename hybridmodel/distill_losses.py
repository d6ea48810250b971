"""The objectives of a distillation's two stages (:mod:`hybridmodel.distill`): what trains in each
(:func:`mixer_parameters`), attention transfer's loss (:func:`transfer_loss`: each GDN layer against the attention it
replaces, on the teacher's own inputs) and end-to-end distillation's (:func:`kd_loss`: KL(teacher ‖ hybrid) per token,
the hybrid in :func:`student_precision`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .hybrid_delta import MIXERS, mixer_state


def mixer_parameters(model, stage: str,
                     transfer_layers: tuple[int, ...] | None = None) -> dict[str, torch.nn.Parameter]:
    """``{name: parameter}`` trained in ``stage``: the GDN layers (those of ``transfer_layers`` if given) in
    attention transfer, every mixer after."""
    if stage != "transfer":
        return mixer_state(model, MIXERS)
    if transfer_layers is None:
        return mixer_state(model, (".linear_attn.",))
    return mixer_state(model, tuple(f"layers.{i}.linear_attn." for i in transfer_layers))


def transfer_loss(student, teacher, ids: torch.Tensor, layers: tuple[int, ...] | None = None) -> torch.Tensor:
    """Σ over GDN layers (those of ``layers`` if given) of ‖GDN(x) − attention(x)‖² / ‖attention(x)‖², x the
    teacher's own input to that layer."""
    pairs, hooks = {}, []
    gdn = {index: layer.linear_attn for index, layer in enumerate(student.model.layers)
           if hasattr(layer, "linear_attn") and (layers is None or index in layers)}
    for index in gdn:
        def record(module, args, kwargs, output, index=index):
            pairs[index] = (kwargs["hidden_states"] if "hidden_states" in kwargs else args[0], output[0])
        hooks.append(teacher.model.layers[index].self_attn.register_forward_hook(record, with_kwargs=True))
    try:
        with torch.no_grad():
            teacher(ids)
    finally:
        for hook in hooks:
            hook.remove()
    total = 0.0
    for index, module in gdn.items():
        x, target = pairs[index]
        out = module(x)
        total = total + (out - target).pow(2).mean() / target.pow(2).mean()
    return total


def student_precision() -> str:
    """``"bfloat16"`` (autocast) where this CPU computes it natively (oneDNN's check: AVX-512 BF16 or AMX), else
    ``"float32"``: without it a bf16 matmul is emulated, about 60x slower than float32 (AVX2, one thread)."""
    return "bfloat16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "float32"


def kd_loss(student, teacher, ids: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of KL(teacher ‖ student) of the next-token distributions; the student in
    :func:`student_precision`."""
    with torch.no_grad():
        target = F.log_softmax(teacher(ids).logits.float(), dim=-1)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=student_precision() == "bfloat16"):
        logits = student(ids).logits
    log_q = F.log_softmax(logits.float(), dim=-1)
    return (target.exp() * (target - log_q)).sum(-1).mean()

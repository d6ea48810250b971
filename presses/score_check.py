"""A press's scores checked before they are used: one line naming the press (a user's own press is code the bench
runs, and its bad scores are its author's to fix, as a bad allocation is) and the first key that is no attention
layer, or the first layer whose scores are missing, misshaped, of a kind a plan cannot rank (complex numbers, sparse,
another device, a tensor subclass whose methods are the press's code) or not finite.

Scores that are not finite may come from the model rather than the press: a model whose weights give NaN or
infinite values fills its own cache with them, and every press scores those. Where that is so, the model is named
instead (:func:`_damaged_layer`), looked at only once the scores have failed.
"""

from __future__ import annotations

import numpy
import torch

from pretrained.model_fault import model_fault
from pretrained.model_info import ModelInfo
from runtime.errors import UsageError

from .base import Press, Scores, ScoringContext


def press_label(press: Press) -> str:
    """``press`` as a message names it: its registered name, or a kvpress press's class."""
    return type(press).__name__ if press.name == "kvpress" else press.name


def plain_mapping(scores):
    """``scores`` as a plain dict, each entry read once (a press's own dict subclass may give other values each time
    one is read); anything else as it is, for :func:`check_scores` to refuse."""
    return dict(scores.items()) if isinstance(scores, dict) else scores


def check_scores(scores: Scores, context: ScoringContext, press: Press | None = None,
                 model: ModelInfo | None = None) -> dict[int, torch.Tensor]:
    """``scores`` keyed by plain ``int`` layers, once they are a finite real dense tensor ``[H_kv, n_body]`` on each
    of ``context``'s attention layers' keys' device, over exactly those layers.

    Parameters
    ----------
    scores : dict[int, torch.Tensor]
        What ``press`` returned: ``[H_kv, n_body]`` per attention layer, keyed by its index (an ``int``, or numpy's).
    context : ScoringContext
        What was scored: its model's layout and its cache (the keys' devices; whether the model's own values are
        finite).
    press : Press, optional
        The press that scored, named by the message.
    model : ModelInfo, optional
        The model as read, named where its own cache holds NaN or infinite values.

    Returns
    -------
    dict[int, torch.Tensor]
        The scores of each attention layer, in the model's order, keyed by Python's ``int``: a key that only equals
        one (``3.0``, numpy's ``int64``) would reach the plan and the rows' per-layer fields (probe 14: rows keyed
        ``'3.0'``, written, then refused by every command on the store).

    Raises
    ------
    UsageError
        Naming the press and the first key that is no attention layer's index, or the first layer whose scores are
        missing, of the wrong shape, type, layout, dtype or device, or not finite; or naming the model and its first
        attention layer whose keys or values are not finite, where the scores are not finite because the model's are
        not.
    """
    adapter = context.adapter
    layers = list(adapter.attention_layers)
    num_kv_heads, n_body = adapter.geometry.num_kv_heads, context.n - context.protected
    shown = "scores" if press is None else f"press {press_label(press)} returned scores that"
    wanted = (f"a press scores each attention layer's body with a finite tensor [H_kv, n_body] = "
              f"{[num_kv_heads, n_body]}")
    if not isinstance(scores, dict):
        raise UsageError(f"{shown} are a {type(scores).__name__}, not {{attention layer: tensor}}; {wanted}")
    keyed: dict[int, tuple] = {}  # layer -> (its key, its scores)
    for key, tensor in scores.items():
        layer = _layer_of(key, f"{shown} have the key", f"(layers {layers}); {wanted}")
        if layer not in layers:  # KeepPlan.from_scores would find no count for it
            raise UsageError(f"{shown} have the key {layer!r}, not an attention layer (layers {layers}); {wanted}")
        if layer in keyed:  # numpy's with a hash of its own: the dict holds both, one of them would be dropped
            first = keyed[layer][0]
            raise UsageError(f"{shown} have two keys of attention layer {layer}, {int(first)} "
                             f"({type(first).__name__}) and {layer} ({type(key).__name__}); {wanted}")
        keyed[layer] = (key, tensor)
    for layer in layers:
        if layer not in keyed:
            raise UsageError(f"{shown} have no entry for attention layer {layer} (layers: {sorted(keyed)}); {wanted}")
        tensor = keyed[layer][1]
        if not isinstance(tensor, torch.Tensor):
            raise UsageError(f"{shown} give layer {layer} a {type(tensor).__name__}; {wanted}")
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter):  # its own methods would run in every check
            raise UsageError(f"{shown} give layer {layer} a {type(tensor).__name__}, a subclass of torch.Tensor whose "
                             f"methods are its own; {wanted}, a plain torch.Tensor (tensor.as_subclass(torch.Tensor))")
        if tuple(tensor.shape) != (num_kv_heads, n_body):
            raise UsageError(f"{shown} give layer {layer} the shape {list(tensor.shape)}; {wanted}")
        if tensor.layout != torch.strided:  # sparse or MKL-DNN (torch._mkldnn): no isfinite, topk or sort of theirs
            layout = str(tensor.layout).removeprefix("torch.").lstrip("_")
            raise UsageError(f"{shown} give layer {layer} a {layout} tensor; {wanted}, a dense (strided) tensor "
                             "(tensor.to_dense())")
        if tensor.is_complex() or tensor.is_quantized:  # no order to rank by (complex) or none torch ranks by
            raise UsageError(f"{shown} give layer {layer} {str(tensor.dtype).removeprefix('torch.')} values; {wanted}, "
                             "of real numbers (a floating-point, integer or bool dtype)")
        keys = _first_tensor(context.kv[layer].keys)
        if tensor.device != keys.device:  # the meta device holds no values to check or rank
            raise UsageError(f"{shown} give layer {layer} a tensor on {tensor.device}; {wanted}, on the device of "
                             f"that layer's keys ({keys.device})")
        if not bool(tensor.isfinite().all()):
            damaged = _damaged_layer(context)
            if damaged is not None:
                directory = model.directory if model is not None else adapter.model_dir
                raise UsageError(model_fault(f"NaN or infinite keys or values at attention layer {damaged} in its "
                                             "own prefill", directory, adapter.dtype))
            raise UsageError(f"{shown} give layer {layer} NaN or infinite values; {wanted}")
    return {layer: keyed[layer][1] for layer in layers}  # keyed by the adapter's own indices, plain ints


def _layer_of(key, shown: str, allowed: str) -> int:
    """``key`` as the plain ``int`` of the layer it names: Python's ``int`` itself or a numpy integer, nothing that
    only looks like one. A subclass of ``int`` hashes and compares by its own methods (probe 15, U4: one with its own
    hash read as "no entry for attention layer 3" beside the key 3, and one equal to everything passed as an extra
    key); a bool is no index; a float or text equal to one would reach the rows' per-layer fields (probe 14)."""
    if type(key) is int:
        return key
    if isinstance(key, numpy.integer):
        return int(key)
    if isinstance(key, int) and not isinstance(key, bool):
        raise UsageError(f"{shown} {int.__repr__(key)} ({type(key).__name__}, a subclass of int), not an attention "
                         f"layer's index, an int or a numpy integer {allowed}")
    raise UsageError(f"{shown} {key!r} ({type(key).__name__}), not an attention layer's index, an int {allowed}")


def _first_tensor(heads) -> torch.Tensor:
    """A layer's keys (``[H_kv, k, d]``), or its first head's where they are ragged (one tensor per head)."""
    return heads[0] if isinstance(heads, tuple) else heads


def _damaged_layer(context: ScoringContext) -> int | None:
    """The first attention layer whose cached keys or values (the model's own prefill) are not finite, or None."""
    for layer in context.adapter.attention_layers:
        kv = context.kv[layer]
        tensors = (*kv.keys, *kv.values) if kv.ragged else (kv.keys, kv.values)
        if not all(bool(t.isfinite().all()) for t in tensors):
            return layer
    return None

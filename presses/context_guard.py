"""A user's press checked to leave the context it scores as it found it.

A context is scored once by every press of a run, and its cache, evidence and fields then give the no-prune rows and
every method's children: a press that changed them in place (``context.kv[3].keys.mul_(-1)``, ``context.kv.clear()``,
``context.n = 5``) corrupted every row of the run, the built-ins' and the baseline's included (probe 12). A user's
press (:func:`runtime.user_code.is_users`) is therefore scored between two :func:`fingerprint` s of the context, and a
difference is one line naming the press and the first part it changed (:func:`check_unchanged`); the project's own
presses are not (they are tested not to change it, and this costs two passes over the cache).

Each tensor is fingerprinted by the SHA-256 of its bytes: exact, where sums of its values miss a permutation or
changes that cancel, and cheap (measured on one core for 100 MB: 0.08 s, where a float64 sum and sum of squares take
0.40 s, and a clone compared after 0.10 s but holds a second copy of the cache). The model's
weights are held to their in-place version counters only (hashing them for every context would cost a pass over the
model): that catches any change made by a torch operation, not one made through ``.data`` or numpy.
"""

from __future__ import annotations

import dataclasses
import hashlib

import torch

from runtime.user_code import UserCodeError

Fingerprint = dict[str, tuple]
"""Per part of a context (``"kv[3].keys"``, ``"n"``), what it was: a tensor's dtype, shape, device and SHA-256, a
value's type and ``repr``, a container's keys, or another object's identity."""
FIRST = ("kv", "recurrent_states")
"""Parts walked first, by the names a press knows them by: the same tensors held elsewhere (``Parent._state``) are
then named by these."""
_SHOWN_VALUES = (int, float, str, bool, type(None), torch.dtype, torch.device)


def _digest(tensor: torch.Tensor) -> str:
    """The SHA-256 of ``tensor``'s bytes (copied to the CPU first where it is elsewhere)."""
    flat = tensor.detach().reshape(-1).contiguous().cpu()
    return hashlib.sha256(flat.view(torch.uint8).numpy()).hexdigest() if flat.numel() else ""


def _walk(value, path: str, into: Fingerprint, seen: dict[int, str]) -> None:
    """``value``'s parts into ``into`` under ``path``; a tensor met before is named by where it was met first."""
    if isinstance(value, torch.Tensor):
        if id(value) in seen:
            into[path] = ("the tensor", seen[id(value)])
            return
        seen[id(value)] = path
        into[path] = ("tensor", value.dtype, tuple(value.shape), value.device, _digest(value))
    elif isinstance(value, _SHOWN_VALUES):
        into[path] = (type(value).__name__, repr(value))
    elif isinstance(value, dict):
        into[path] = ("keys", [repr(key) for key in value])
        for key, item in list(value.items()):
            _walk(item, f"{path}[{key!r}]", into, seen)
    elif isinstance(value, (list, tuple)):
        into[path] = (type(value).__name__, len(value))
        for index, item in enumerate(value):
            _walk(item, f"{path}[{index}]", into, seen)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        into[path] = ("object", type(value), id(value))
        for field in dataclasses.fields(value):
            _walk(getattr(value, field.name), f"{path}.{field.name}", into, seen)
    else:  # the adapter (the model), the tokenizer: what they are, not what they hold
        into[path] = ("object", type(value), id(value))


def fingerprint(context) -> Fingerprint:
    """Every part of ``context`` a press could change: its cache, recurrent states, evidence, token ids and fields
    (each of its attributes, walked through dicts, lists, tuples and dataclasses), and its model's weights' version
    counters."""
    into: Fingerprint = {}
    seen: dict[int, str] = {}
    for name in FIRST:
        if hasattr(type(context), name):
            _walk(getattr(context, name), name, into, seen)
    for name, value in vars(context).items():
        _walk(value, name, into, seen)
    model = getattr(getattr(context, "adapter", None), "model", None)
    if isinstance(model, torch.nn.Module):
        # an inference tensor keeps no version counter
        into["the model's weights"] = ("versions", [None if t.is_inference() else t._version
                                                    for t in (*model.parameters(), *model.buffers())])
    return into


def check_unchanged(before: Fingerprint, after: Fingerprint, shown: str) -> None:
    """A :class:`~runtime.user_code.UserCodeError` naming ``shown`` (``"press mine"``) and the first part of the
    context that differs between ``before`` and ``after`` its scoring, if any does."""
    changed = next((path for path, was in before.items() if after.get(path) != was), None)
    if changed is None:
        changed = next((path for path in after if path not in before), None)
    if changed is None:
        return
    was, now = before.get(changed), after.get(changed)
    told = f": {was[1]} → {now[1] if now is not None else 'removed'}" if was and was[0] in ("int", "str") else ""
    raise UserCodeError(f"{shown} changed the context it scores ({changed}{told}): a press reads the context and "
                        "returns scores; its cache, evidence and fields are what every other method and the no-prune "
                        "baseline of the run are computed from; change copies of them (`.clone()`), not them")

"""Every press checked to leave the context it scores as it found it.

A context is scored once by every press of a run, and its cache, evidence and fields then give the no-prune rows and
every method's children: a press that changed them in place (``context.kv[3].keys.mul_(-1)``, ``context.kv.clear()``,
``context.n = 5``) corrupted every row of the run, the built-ins' and the baseline's included (probe 12). Every press,
the project's own too (probe 13: a new file in ``presses/`` is as new as a user's module), is therefore scored between
two :func:`fingerprint` s of the context, and a difference is one line naming the press and the first part it changed
(:func:`check_unchanged`). Once the context's rows are made, before any is written, it is fingerprinted again
(:func:`check_kept`): probe 13's press left a thread changing the cache after its own check.

Each tensor is fingerprinted by the SHA-256 of its bytes (:func:`runtime.model_guard.tensor_digest`): exact, where sums
of its values miss a permutation or changes that cancel. The model's weights are held here to their in-place version
counters, which any change made by a torch operation moves; one made through ``.data`` or numpy is found by their
SHA-256, once per context (:class:`runtime.model_guard.HeldModel`).
"""

from __future__ import annotations

import dataclasses

import torch

from runtime.model_guard import tensor_digest
from runtime.process_guard import threads_left
from runtime.user_code import UserCodeError

Fingerprint = dict[str, tuple]
"""Per part of a context (``"kv[3].keys"``, ``"n"``), what it was: a tensor's dtype, shape, device and SHA-256, a
value's type and ``repr``, a container's keys, or another object's identity."""
FIRST = ("kv", "recurrent_states")
"""Parts walked first, by the names a press knows them by: the same tensors held elsewhere (``Parent._state``) are
then named by these."""
_SHOWN_VALUES = (int, float, str, bool, type(None), torch.dtype, torch.device)


def _walk(value, path: str, into: Fingerprint, seen: dict[int, str]) -> None:
    """``value``'s parts into ``into`` under ``path``; a tensor met before is named by where it was met first."""
    if isinstance(value, torch.Tensor):
        if id(value) in seen:
            into[path] = ("the tensor", seen[id(value)])
            return
        seen[id(value)] = path
        into[path] = ("tensor", value.dtype, tuple(value.shape), value.device, tensor_digest(value))
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


def _first_change(before: Fingerprint, after: Fingerprint) -> str | None:
    """The first part of a context that differs between ``before`` and ``after`` (with its values, for a number or
    a text: ``"n: 40 → 5"``), or None."""
    changed = next((path for path, was in before.items() if after.get(path) != was), None)
    if changed is None:
        changed = next((path for path in after if path not in before), None)
    if changed is None:
        return None
    was, now = before.get(changed), after.get(changed)
    told = f": {was[1]} → {now[1] if now is not None else 'removed'}" if was and was[0] in ("int", "str") else ""
    return changed + told


def check_unchanged(before: Fingerprint, after: Fingerprint, shown: str) -> None:
    """A :class:`~runtime.user_code.UserCodeError` naming ``shown`` (``"press mine"``) and the first part of the
    context that differs between ``before`` and ``after`` its scoring, if any does."""
    changed = _first_change(before, after)
    if changed is not None:
        raise UserCodeError(f"{shown} changed the context it scores ({changed}{threads_left()}): a press reads the "
                            "context and returns scores; its cache, evidence and fields are what every other method "
                            "and the no-prune baseline of the run are computed from; change copies of them "
                            "(`.clone()`), not them")


def kept_parts(fingerprint: Fingerprint) -> Fingerprint:
    """``fingerprint`` but the evidence's parts: what a context's rows are made from once every press scored it and its
    evidence was let go."""
    return {path: was for path, was in fingerprint.items() if not path.startswith("evidence")}


def after_scoring(scored_by: tuple[str, ...], context: str = "it") -> str:
    """When a change after the fact was found, by the presses that scored ``context`` (their labels, in order):
    ``"after presses pkeep, snapkv scored it, in that order"``."""
    if not scored_by:
        return f"after {context} was prefilled (no press scored {context})"
    if len(scored_by) == 1:
        return f"after press {scored_by[0]} scored {context}"
    return f"after presses {', '.join(scored_by)} scored {context}, in that order"


def check_kept(scored: Fingerprint, now: Fingerprint, scored_by: tuple[str, ...]) -> None:
    """A :class:`~runtime.user_code.UserCodeError` where the context changed after it was scored (``scored``, its
    fingerprint once every press scored it and its evidence was let go) and before its rows are written (``now``),
    naming the presses that scored it (``scored_by``, labels in order: the last is the last that ran) and threads a
    press left running (:func:`runtime.process_guard.threads_left`): probe 13's press left a thread changing the
    cache it kept, whose changes the check around its own scoring missed."""
    changed = _first_change(scored, now)
    if changed is not None:
        raise UserCodeError(f"the context changed {after_scoring(scored_by)} ({changed}), before its rows were "
                            f"written{threads_left()}: a press reads the context and returns scores, and leaves "
                            "nothing running that changes it later (a thread of its own holding its tensors); the "
                            "context's rows were not written")

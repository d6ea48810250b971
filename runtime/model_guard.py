"""The model and the functions it runs through, held to stay as they were while presses and allocators run.

Probe 13: presses that left forward hooks on the model's modules, changed its buffers or parameters through ``.data``
(which no version counter sees), or replaced ``torch.nn.functional.scaled_dot_product_attention`` changed every later
row of the run, the no-prune baseline's included, and the run ended 0. Two holds, one difference check
(:func:`changed`):

- around each call of a press's or allocator's code (:func:`runtime.user_code.run_users`), what is cheap to read
  (:func:`state`): by identity, the attributes of ``torch``, ``torch.nn.functional``, ``torch.Tensor`` and
  transformers' attention registry, and torch's global hook dicts; and, for a call given the model, each of its
  modules' hook dicts, submodules, parameters and buffers (which tensor, on which storage), class, instance
  ``forward`` and training flag (1 ms for the default model's 205 modules);
- once per context (:class:`HeldModel`), the same and the SHA-256 of every parameter's and buffer's bytes: what a
  change in place through ``.data`` leaves to be seen by.
"""

from __future__ import annotations

import hashlib
import sys

import torch
import torch.nn.functional
import torch.nn.modules.module

NAMESPACES = {"torch": torch, "torch.nn.functional": torch.nn.functional, "torch.Tensor": torch.Tensor}
"""What the model's forward and the runtime call functions of, by the names messages give them."""
REGISTRY = "ALL_ATTENTION_FUNCTIONS"
HOOK_DICTS = tuple(name for name, value in vars(torch.nn.Module()).items() if "hooks" in name and isinstance(value,
                                                                                                          dict))
"""A module's own hook dicts (``_forward_hooks``, ``_forward_pre_hooks`` …), as torch names them."""
GLOBAL_HOOKS = tuple(name for name, value in vars(torch.nn.modules.module).items()
                     if name.startswith("_global") and isinstance(value, dict))
"""torch's hook dicts for every module (``register_module_forward_hook`` …)."""
MODULE_PARTS = ("class, forward and training flag", *HOOK_DICTS, "submodules", "parameters", "buffers")
"""What :func:`_module` reads of a module, in order, as messages name each."""
State = dict[str, object]
"""``{"namespaces": {name: a copy of its attributes}, "global hooks": …, "modules": {path: what it was}}``."""


def tensor_digest(tensor: torch.Tensor) -> str:
    """The SHA-256 of ``tensor``'s bytes (copied to the CPU first where it is elsewhere): exact, where sums of its
    values miss a permutation or changes that cancel, and cheap (one core: 0.08 s for 100 MB; a float64 sum and sum of
    squares take 0.40 s, and a clone compared after 0.10 s but holds a second copy)."""
    flat = tensor.detach().reshape(-1).contiguous().cpu()
    return hashlib.sha256(flat.view(torch.uint8).numpy()).hexdigest() if flat.numel() else ""


def _hooks(hook_dict: dict | None) -> tuple | int:
    """A hook dict by identity: its own, and each hook's."""
    return (id(hook_dict), *map(id, hook_dict.values())) if hook_dict else id(hook_dict)


def _tensors(tensors: dict) -> tuple:
    """A module's own parameters or buffers: which tensor each name holds, and on which storage."""
    return tuple((name, id(t), t.data_ptr()) if t is not None else name for name, t in tensors.items())


def _module(module: torch.nn.Module) -> tuple:
    """What a call may change of ``module`` itself, one entry per part of :data:`MODULE_PARTS`."""
    own = module.__dict__
    return ((id(type(module)), id(own.get("forward")), module.training), *map(_hooks, map(own.get, HOOK_DICTS)),
            tuple((name, id(child)) for name, child in own["_modules"].items()), _tensors(own["_parameters"]),
            _tensors(own["_buffers"]))


def _namespaces() -> dict[str, dict]:
    """A copy of the attributes of each of :data:`NAMESPACES` and of transformers' attention registry (where it is
    imported: the model's loading imports it)."""
    copies = {shown: dict(vars(namespace)) for shown, namespace in NAMESPACES.items()}
    registry = getattr(sys.modules.get("transformers.modeling_utils"), REGISTRY, None)
    if registry is not None:
        copies[REGISTRY] = {name: registry[name] for name in registry}
    return copies


def state(model: torch.nn.Module | None) -> State:
    """What a call is held to leave as it found: :func:`_namespaces`, torch's global hooks and, given ``model``, each
    of its modules (:func:`_module`, by path)."""
    return {"namespaces": _namespaces(), "global hooks": tuple(_hooks(vars(torch.nn.modules.module)[name])
                                                               for name in GLOBAL_HOOKS),
            "modules": {path: _module(module) for path, module in model.named_modules()} if model is not None else {}}


def weights(model: torch.nn.Module) -> dict[str, str]:
    """The SHA-256 of every parameter and buffer of ``model``, by name: a change through ``.data`` (or numpy, or
    another view) that nothing else records."""
    return {name: tensor_digest(tensor) for name, tensor in (*model.named_parameters(), *model.named_buffers())}


def _kvpress_patch(was, now) -> bool:
    """Whether ``now`` is kvpress's wrapper of ``was``: importing kvpress wraps each function of transformers'
    attention registry (``kvpress.attention_patch``) in one that masks keys only for modules that ask for it, and the
    project's kvpress presses import it when first used."""
    patch = sys.modules.get("kvpress.attention_patch")
    return (patch is not None and getattr(now, "__wrapped__", None) is was
            and getattr(now, "__code__", None) is patch.attention_patch(was).__code__)


def _replaced(shown: str, before: dict, after: dict) -> tuple[str, str] | None:
    """The first attribute of namespace ``shown`` that ``after`` holds another object for (or none), than ``before``."""
    try:
        if before == after:  # each value is its own first: equal dicts of the same objects, without a value's __eq__
            return None
    except Exception:  # noqa: BLE001, S110 - a value whose __eq__ raises (a tensor put there): compared one by one
        pass
    for name, was in before.items():
        now = after.get(name)
        if now is not was and not (shown == REGISTRY and _kvpress_patch(was, now)):
            return (f"{REGISTRY}[{name!r}]" if shown == REGISTRY else f"{shown}.{name}",
                    "replaced" if name in after else "removed")
    return None


def changed(before: State, after: State) -> tuple[str, str] | None:
    """What differs between ``before`` and ``after``, and how, as messages name it: ``("torch.softmax",
    "replaced")``, ``("the model", "model.layers.0.mlp: its _forward_hooks")``; None if nothing. What only
    ``after`` holds is not looked at: an attribute added (a submodule torch imports lazily) replaces nothing, and a
    part added to the model shows where it was added (its parent's submodules or hooks)."""
    for shown, attributes in before["namespaces"].items():
        found = _replaced(shown, attributes, after["namespaces"].get(shown, {}))
        if found:
            return found
    for name, was, now in zip(GLOBAL_HOOKS, before["global hooks"], after["global hooks"]):
        if was != now:
            return "torch", f"torch.nn.modules.module.{name}"
    for path, was in before["modules"].items():
        now = after["modules"].get(path)
        if now != was:
            part = "its place" if now is None else next(p for p, a, b in zip(MODULE_PARTS, was, now) if a != b)
            return "the model", f"{path or 'the model itself'}: {part}"
    return None


class HeldModel:
    """``model`` as it was when held (:func:`state`), with its weights' SHA-256 (:func:`weights`): what each context
    of a run is checked against once its rows are made (:meth:`changed`), before any is written."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.state, self.weights = state(model), weights(model)

    def changed(self) -> tuple[str, str] | None:
        """What of :attr:`model` (or of the functions it runs through) differs from when it was held, and how
        (:func:`changed`: the weights' values last); None if nothing."""
        found = changed(self.state, state(self.model))
        if found:
            return found
        now = weights(self.model)
        name = next((name for name, digest in self.weights.items() if now.get(name) != digest), None)
        return None if name is None else ("the model's weights", f"{name}: its SHA-256 differs")

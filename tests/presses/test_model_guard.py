"""Probe 13: a press that changed the model rather than the context — forward hooks left on its modules, buffers or
parameters changed through ``.data`` (no version counter sees it), a torch function replaced — changed every later row
of the run, the built-ins' and the no-prune baseline's, and the run ended 0. A change seen around the press's call is
refused in one line naming the press and what it changed; a change only the weights' SHA-256 sees is found once per
context (:class:`runtime.model_guard.HeldModel`), before the context's rows are written."""

import re

import pytest
import torch
import torch.nn.functional as F
import torch.nn.modules.module as torch_module
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from presses import Selection
from presses.keydiff import KeyDiffPress
from runtime import prefill
from runtime.model_guard import HeldModel
from runtime.user_code import UserCodeError


@pytest.fixture
def parent(tiny):
    torch.manual_seed(0)
    return prefill(tiny("qwen3_5"), torch.randint(0, 97, (40,)), protected=4)


@pytest.fixture
def put_back(monkeypatch, parent):
    """What the presses below change, put back after each test: the model is the session's."""
    model = parent.adapter.model
    for namespace, name in ((F, "scaled_dot_product_attention"), (torch.Tensor, "topk"), (torch, "softmax")):
        monkeypatch.setattr(namespace, name, getattr(namespace, name))
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "sdpa", ALL_ATTENTION_FUNCTIONS["sdpa"])
    tensors = dict((*model.named_parameters(), *model.named_buffers()))
    saved = {name: tensor.detach().clone() for name, tensor in tensors.items()}
    handles = []
    yield handles
    for handle in handles:
        handle.remove()
    model.eval()
    for name, tensor in tensors.items():
        tensor.data = saved[name]


def _users_press(change, handles=None):
    """A press of this test module (a user's): KeyDiff's scores, then ``change(model, handles)`` (``handles``: where
    it leaves hooks' handles, for the test to remove them)."""
    def score(self, context):
        scores = KeyDiffPress.score(self, context)
        change(context.adapter.model, handles)
        return scores
    return type("Changing", (KeyDiffPress,), {"score": score})()


def _mlp(model):
    return next(module for name, module in model.named_modules() if name.endswith("mlp"))


def _mlp_path(model):
    return next(name for name, _ in model.named_modules() if name.endswith("mlp"))


@pytest.mark.parametrize("change, what", [
    (lambda m, h: h.append(_mlp(m).register_forward_hook(lambda *a: None)), "the model in score ({mlp}: "
                                                                            "_forward_hooks)"),
    (lambda m, h: h.append(_mlp(m).register_forward_pre_hook(lambda *a: None)), "the model in score ({mlp}: "
                                                                                "_forward_pre_hooks)"),
    (lambda m, h: h.append(torch_module.register_module_forward_hook(lambda *a: None)),
     "torch in score (torch.nn.modules.module._global_forward_hooks)"),
    (lambda m, h: setattr(F, "scaled_dot_product_attention", lambda *a, **k: None),
     "torch.nn.functional.scaled_dot_product_attention in score (replaced)"),
    (lambda m, h: setattr(torch.Tensor, "topk", lambda *a, **k: None), "torch.Tensor.topk in score (replaced)"),
    (lambda m, h: setattr(torch, "softmax", lambda *a, **k: None), "torch.softmax in score (replaced)"),
    (lambda m, h: ALL_ATTENTION_FUNCTIONS.__setitem__("sdpa", lambda *a, **k: None),
     "ALL_ATTENTION_FUNCTIONS['sdpa'] in score (replaced)"),
    (lambda m, h: m.train(), "the model in score (the model itself: class, forward and training flag)"),
    (lambda m, h: setattr(next(iter(m.parameters())), "data", torch.zeros(1)), "the model in score ({first}: "
                                                                               "parameters)"),
])
def test_a_press_changing_the_model_or_torch_is_refused_naming_what(parent, put_back, change, what):
    press = _users_press(change, put_back)
    first = next(iter(parent.adapter.model.named_parameters()))[0].rpartition(".")[0]
    said = what.format(mlp=_mlp_path(parent.adapter.model), first=first)
    with pytest.raises(UserCodeError, match=re.escape(f"press keydiff changed {said}") + ".*; a press or allocator "
                                            "the bench runs returns its result and leaves the process, the model and "
                                            "torch's functions as it found them"):
        Selection(parent, press).scores  # noqa: B018 - scored on first use


@pytest.mark.parametrize("tensors", ["parameters", "buffers"])
def test_weights_changed_through_data_are_found_by_their_digest(parent, put_back, tensors):
    """``.data`` changes no version counter and no identity: the press's own call passes, the context's check does
    not."""
    model = parent.adapter.model
    held = HeldModel(model)
    changed = next(name for name, t in getattr(model, f"named_{tensors}")() if t.is_floating_point())

    def halve(model, handles):
        dict(getattr(model, f"named_{tensors}")())[changed].data.mul_(0.5)

    Selection(parent, _users_press(halve)).scores  # noqa: B018 - scored on first use
    assert held.changed() == ("the model's weights", f"{changed}: its SHA-256 differs")


def test_a_clean_press_leaves_the_held_model_unchanged(parent):
    held = HeldModel(parent.adapter.model)
    Selection(parent, KeyDiffPress()).scores  # noqa: B018 - scored on first use
    assert held.changed() is None

"""The library's checks of what a caller passes: scores, press options and evidence, token ids and plans, budget
weights, the pipeline's arguments, damaged artifacts; each refusal one clear error naming what is wrong."""

import re
from dataclasses import dataclass

import numpy
import pytest
import torch

import allocators
import presses
from allocators import BudgetRequest
from runtime import EvidenceRequest, KeepPlan, prefill
from runtime.errors import UsageError
from tests.helpers import HYBRID_FAMILIES, copy_model, truncate


def _parent(tiny, n=60, protected=4, evidence=EvidenceRequest()):
    torch.manual_seed(0)
    return prefill(tiny("qwen3_5"), torch.randint(0, 97, (n,)), protected=protected, evidence=evidence)


@dataclass
class _GivenScores(presses.Press):
    """A press whose scores are handed to it: what a press of one's own might return."""

    name = "given-scores"
    scores: dict = None

    def score(self, context: presses.ScoringContext) -> presses.Scores:
        return self.scores


def test_a_selection_refuses_bad_scores(tiny):
    parent = _parent(tiny)
    scores = {layer: torch.rand(2, parent.n - parent.protected) for layer in parent.adapter.attention_layers}
    first = parent.adapter.attention_layers[0]
    with_nan = scores[first].masked_fill(torch.rand_like(scores[first]) < 0.1, float("nan"))
    with pytest.raises(UsageError, match=f"^press given-scores returned scores that give layer {first} NaN or "
                                         r"infinite values; a press scores each attention layer's body with a finite "
                                         r"tensor \[H_kv, n_body\] = \[2, 56\]$"):
        presses.Selection(parent, _GivenScores(scores={**scores, first: with_nan})).plan("flat", 0.5)
    with pytest.raises(UsageError, match=r"give layer \d+ the shape \[2, 20\]; .* = \[2, 56\]$"):
        presses.Selection(parent, _GivenScores(scores={**scores, first: torch.rand(2, 20)})).plan("flat", 0.5)
    with pytest.raises(UsageError, match=r"returned scores that give layer \d+ a list;"):
        presses.Selection(parent, _GivenScores(scores={**scores, first: [1.0]})).plan("flat", 0.5)
    assert presses.Selection(parent, _GivenScores(scores=scores)).plan("flat", 0.5).total() == 2 * 2 * 28


@pytest.mark.parametrize("made, says", [
    (lambda s: s.to("meta"), r"a tensor on meta; .* = \[2, 56\], on the device of that layer's keys \(cpu\)$"),
    (lambda s: s.to(torch.complex64), r"complex64 values; .* = \[2, 56\], of real numbers \(a floating-point, "
                                      r"integer or bool dtype\)$"),
    (lambda s: s.to_sparse(), r"a sparse_coo tensor; .* = \[2, 56\], a dense \(strided\) tensor "
                              r"\(tensor.to_dense\(\)\)$"),
    pytest.param(lambda s: s.to_sparse_csr(), r"a sparse_csr tensor; .* a dense \(strided\) tensor",
                 marks=pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")),
    pytest.param(lambda s: s.to_mkldnn(), r"a mkldnn tensor; .* a dense \(strided\) tensor",
                 marks=pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without it")),
])
def test_a_selection_refuses_scores_it_cannot_rank(tiny, made, says):
    """Probe 11: scores on the meta device ended in torch's ``Tensor.item() cannot be called on meta tensors``, and
    complex ones were taken silently (ranked by their real part). Probe 14: sparse (COO, CSR) and MKL-DNN scores
    ended in a traceback of torch's from inside the check."""
    parent = _parent(tiny)
    scores = {layer: torch.rand(2, parent.n - parent.protected) for layer in parent.adapter.attention_layers}
    last = parent.adapter.attention_layers[-1]
    with pytest.raises(UsageError, match=rf"^press given-scores returned scores that give layer {last} {says}"):
        presses.Selection(parent, _GivenScores(scores={**scores, last: made(scores[last])})).plan("flat", 0.5)


@pytest.mark.parametrize("keyed, says", [
    (lambda scores: {float(layer): s for layer, s in scores.items()},
     r"have the key {first}.0 \(float\), not an attention layer's index, an int \(layers {layers}\); a press scores"),
    (lambda scores: {**scores, "3": scores[3]}, r"have the key '3' \(str\), not an attention layer's index, an int"),
    (lambda scores: {**scores, 0: scores[3]}, r"have the key 0, not an attention layer \(layers {layers}\); a press"),
    (lambda scores: {**scores, 999: scores[3]}, r"have the key 999, not an attention layer \(layers {layers}\)"),
])
def test_scores_keyed_by_no_attention_layer_are_refused(tiny, keyed, says):
    """Probe 14: scores keyed ``3.0`` passed the check (``3.0 in scores`` finds the int 3) and wrote rows keyed
    ``'3.0'``, which every later command on the store refused; an extra key (layer 0, a GDN layer) ended in a
    ``KeyError`` in the plan."""
    parent = _parent(tiny)
    layers = list(parent.adapter.attention_layers)
    assert 0 not in layers and 3 in layers
    scores = {layer: torch.rand(2, parent.n - parent.protected) for layer in layers}
    said = says.format(first=layers[0], layers=re.escape(str(layers)))
    with pytest.raises(UsageError, match=f"^press given-scores returned scores that {said}"):
        presses.Selection(parent, _GivenScores(scores=keyed(scores))).plan("flat", 0.5)


def test_scores_keyed_by_numpy_integers_are_planned_by_plain_ints(tiny):
    """An allocation's numpy integers are taken, and so are scores': keyed by Python's ints from the check on."""
    parent = _parent(tiny)
    layers = list(parent.adapter.attention_layers)
    scores = {numpy.int64(layer): torch.rand(2, parent.n - parent.protected) for layer in layers}
    selection = presses.Selection(parent, _GivenScores(scores=scores))
    assert selection.plan("flat", 0.5).total() == 2 * 2 * 28
    assert [(type(layer), layer) for layer in selection.scores] == [(int, layer) for layer in layers]


class _Layer(int):
    """An int with a hash of its own: ``3 in scores`` misses it, so the layer read "no entry" beside the key 3."""

    def __hash__(self):
        return hash(str(int(self)))


class _AlwaysEqual(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


class _OddInt64(numpy.int64):
    def __hash__(self):
        return -7


@pytest.mark.parametrize("keyed, says", [
    (lambda scores: {**scores, _Layer(3): scores[3]}, r"have the key 3 \(_Layer, a subclass of int\), not an "
                                                       r"attention layer's index, an int or a numpy integer"),
    (lambda scores: {_Layer(k): s for k, s in scores.items()}, r"have the key \d+ \(_Layer, a subclass of int\)"),
    (lambda scores: {**scores, _AlwaysEqual(999): scores[3]}, r"have the key 999 \(_AlwaysEqual, a subclass of int\)"),
    (lambda scores: {**scores, True: scores[3]}, r"have the key True \(bool\), not an attention layer's index"),
    (lambda scores: {**scores, _OddInt64(3): scores[3]}, r"have two keys of attention layer 3, 3 \(int\) and 3 "
                                                         r"\(_OddInt64\); a press scores"),
], ids=["beside the int", "every key", "equal to everything", "bool", "numpy's twice"])
def test_scores_keyed_by_what_only_looks_like_a_layer_are_refused(tiny, keyed, says):
    """Probe 15, U4: an int subclass with its own hash read as "no entry for attention layer 3"; two keys of one
    layer were taken, the plain int's entry used; an int subclass equal to everything passed as an extra key."""
    parent = _parent(tiny)
    layers = list(parent.adapter.attention_layers)
    scores = {layer: torch.rand(2, parent.n - parent.protected) for layer in layers}
    with pytest.raises(UsageError, match=f"^press given-scores returned scores that {says}"):
        presses.Selection(parent, _GivenScores(scores=keyed(scores))).plan("flat", 0.5)


class _Watched(torch.Tensor):
    """A tensor subclass that records every torch call made on it: code of the press's own."""

    calls = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls.append(func)
        return super().__torch_function__(func, types, args, kwargs or {})


def test_scores_of_a_tensor_subclass_are_refused_before_its_code_runs(tiny):
    """Probe 12's leftover: a tensor subclass's ``__torch_function__`` ran in the bench's checks and in the ranking,
    outside the guard on a user's code (a raising one ended in a traceback, a lying one could pass the checks)."""
    parent = _parent(tiny)
    scores = {layer: torch.rand(2, parent.n - parent.protected) for layer in parent.adapter.attention_layers}
    first = parent.adapter.attention_layers[0]
    watched = scores[first].as_subclass(_Watched)
    _Watched.calls.clear()
    with pytest.raises(UsageError, match=rf"^press given-scores returned scores that give layer {first} a _Watched, a "
                                         r"subclass of torch.Tensor whose methods are its own; .* = \[2, 56\], a "
                                         r"plain torch.Tensor \(tensor.as_subclass\(torch.Tensor\)\)$"):
        presses.Selection(parent, _GivenScores(scores={**scores, first: watched})).plan("flat", 0.5)
    assert _Watched.calls == []


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.float16, torch.float64])
def test_real_scores_of_any_dtype_are_ranked(tiny, dtype):
    """Integer, bool and other floating-point scores rank as they did before complex ones were refused."""
    parent = _parent(tiny)
    scores = {layer: (torch.rand(2, parent.n - parent.protected) * 10).to(dtype)
              for layer in parent.adapter.attention_layers}
    assert presses.Selection(parent, _GivenScores(scores=scores)).plan("flat", 0.5).total() == 2 * 2 * 28


def test_a_model_whose_own_cache_is_not_finite_is_named_not_the_press(tiny):
    """Probe 11: a model whose weights give NaN made every press's scores NaN, and the message blamed the press
    (a built-in one) and not the model."""
    parent = _parent(tiny)
    layer = parent.adapter.attention_layers[-1]
    parent.kv[layer].values[1, 7, 0] = float("inf")  # as the model's own prefill leaves it
    parent.kv[layer].keys[0, 9, 0] = float("nan")
    with pytest.raises(UsageError, match=rf"^the model gives NaN or infinite keys or values at attention layer {layer} "
                                         "in its own prefill, before any press: its weights are damaged"):
        presses.compress(parent, "keydiff", "flat", keep_fraction=0.5)
    parent = _parent(tiny)
    scores = {layer: torch.full((2, parent.n - parent.protected), float("nan")) for layer in parent.kv}
    with pytest.raises(UsageError, match="^press given-scores returned scores that give layer"):  # a finite cache
        presses.Selection(parent, _GivenScores(scores=scores)).plan("flat", 0.5)


def test_snapkv_inputs(tiny):
    with pytest.raises(ValueError, match="window=-5"):
        presses.get("snapkv", window=-5)
    with pytest.raises(ValueError, match="kernel=8: expected an odd integer"):
        presses.get("snapkv", kernel=8)
    press = presses.get("snapkv")
    with pytest.raises(ValueError, match="prefill with evidence=press.evidence"):
        press.score(_parent(tiny))
    short = _parent(tiny, n=20, evidence=press.evidence(None))  # shorter than the 32-token window
    scores = press.score(short)
    assert all(s.shape == (2, 16) for s in scores.values())
    assert presses.compress(short, press, "flat", keep_fraction=0.5).kv_nbytes > 0


def test_token_ids_and_protected_are_checked(tiny):
    model = tiny("qwen3_5")
    with pytest.raises(ValueError,
                       match=r"context_ids\[2\] = 97 is not a token id of this model: ids must be in \[0, 97\)"):
        prefill(model, torch.tensor([1, 2, 97, 3]))
    with pytest.raises(ValueError, match=r"context_ids\[0\] = -1"):
        prefill(model, torch.tensor([-1, 2, 3]))
    with pytest.raises(ValueError, match="protected=8.5 must be an integer"):
        prefill(model, torch.arange(20), protected=8.5)
    parent = prefill(model, torch.arange(20))
    with pytest.raises(ValueError, match=r"question_ids\[1\] = 500"):
        parent.answer(torch.tensor([1, 500]), 2)


def test_plan_positions_may_be_any_integer_sequence(tiny):
    parent = _parent(tiny, n=30)
    as_lists = KeepPlan({layer: [[4, 7, 9], list(range(10, 20))] for layer in parent.adapter.attention_layers})
    as_tensors = KeepPlan({layer: [torch.tensor([4, 7, 9]), torch.arange(10, 20)]
                           for layer in parent.adapter.attention_layers})
    question = torch.tensor([5, 6])
    assert torch.equal(parent.fork(as_lists).logits(question), parent.fork(as_tensors).logits(question))
    with pytest.raises(ValueError, match="positions must be integers, got torch.float32"):
        KeepPlan({3: [[4.0, 5.5]]})


def test_gate_allocator_refuses_non_finite_weights():
    request = BudgetRequest(0.5, 100, (3, 7), 2, layer_weights={3: float("nan"), 7: 1.0})
    with pytest.raises(ValueError, match="must be finite, non-negative"):
        allocators.get("gate").allocate(request)


def test_the_abstract_kvpress_base_is_not_offered():
    with pytest.raises(ValueError) as error:
        presses.get("kvpress:NoSuchPress")
    assert "KnormPress" in str(error.value) and "ScorerPress," not in str(error.value)
    with pytest.raises(ValueError, match="abstract base"):
        presses.get("kvpress:ScorerPress")


def test_library_messages_say_what_is_wrong(tiny):
    model = tiny("qwen3_5")
    with pytest.raises(ValueError, match="context_ids is empty: give at least one token id"):
        prefill(model, torch.tensor([]))
    for dtype in (torch.int8, torch.uint8):
        with pytest.raises(ValueError, match=f"must be of an integer type int64 or int32, got {dtype}"):
            prefill(model, torch.tensor([1, 2, 3], dtype=dtype))
    parent = prefill(model, torch.arange(20))
    parent.release()
    with pytest.raises(RuntimeError, match="this parent was released; its cache and evidence are gone: prefill "
                                           "the context again"):
        parent.fork(KeepPlan({}))


def test_a_selection_without_its_evidence_says_which(tiny):
    for name, missing in [("kvpress:SnapKVPress", "the attention layers' inputs of the last 60 context tokens"),
                          ("snapkv", "the attention layers' inputs of the last 32 context tokens")]:
        with pytest.raises(ValueError, match=f"reads {missing}.*pass evidence=press.evidence\\(adapter\\) to prefill"):
            presses.Selection(_parent(tiny), presses.get(name))


def test_a_selection_of_a_released_parent_says_it_was_released(tiny):
    """Not that the evidence is missing: it was there, and went with the release."""
    from runtime.errors import ReleasedError

    press = presses.get("snapkv")
    parent = _parent(tiny, evidence=press.evidence(None))
    selection = presses.Selection(parent, press)
    parent.release()
    with pytest.raises(ReleasedError, match="this parent was released"):
        selection.fork("flat", 0.2)


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_a_selection_without_the_recurrent_signals_says_so_on_every_hybrid(tiny, family):
    """GateSight reads the signals of the recurrent layers, GDN or Mamba2: a parent prefilled without them is refused
    when the selection is made, before anything is scored."""
    parent = prefill(tiny(family), torch.randint(0, 97, (60,), generator=torch.Generator().manual_seed(0)))
    press = presses.get("gatesight", estimator=presses.GateSightEstimator.random(parent.adapter))
    with pytest.raises(ValueError, match="reads the recurrent layers' signals, which this parent was prefilled "
                                         "without: pass evidence=press.evidence\\(adapter\\) to prefill"):
        presses.Selection(parent, press)


def test_the_pipeline_names_a_wrong_argument(tiny):
    from hybridmodel.tokenizer import build_tokenizer
    from presses.keydiff import KeyDiffPress

    pipe = presses.pipeline(tiny("qwen3_5"), build_tokenizer())
    with pytest.raises(TypeError, match=r"press must be .* got the class KeyDiffPress \(pass an instance: "
                                        r"KeyDiffPress\(\)\)"):
        pipe("some context", ["q?"], press=KeyDiffPress, keep_fraction=0.5)
    with pytest.raises(TypeError, match="questions must be a string or a list of strings, got NoneType None"):
        pipe("some context", None, press="keydiff", keep_fraction=0.5)
    with pytest.raises(TypeError, match="context must be a string"):
        pipe(None, ["q?"], press="keydiff", keep_fraction=0.5)


def test_a_damaged_artifact_is_named_by_the_library(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    copy = copy_model(model_dir, tmp_path)
    truncate(copy / "gatesight" / "gatesight.safetensors")
    model = AutoModelForCausalLM.from_pretrained(copy).eval()
    parent = prefill(model, torch.arange(40), protected=4, evidence=presses.get("gatesight").evidence(None))
    with pytest.raises(ValueError, match=f"{copy}: the artifacts press 'gatesight' reads there are damaged"):
        presses.Selection(parent, "gatesight")

"""The helpers of ``benchmarks/hybrid_diagnosis.py`` against references: a model's reading of a question equals one
plain forward pass over it, the swapped attention layer reproduces the model's own attention on its own stream, a
moved needle leaves the haystack as it was and lands at the nearest sentence boundary, and the intervals are the
textbook ones."""

import importlib
import json
from pathlib import Path

import pytest
import torch

from hybridmodel.tokenizer import build_tokenizer
from runtime import encode_text
from runtime.errors import UsageError
from tests.helpers import token_ids
from workloads.tasks import Config, generate

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def diagnosis():
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))  # a script: it imports its sibling teacher_layer_split
        return importlib.import_module("hybrid_diagnosis")


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _item(tokenizer, task="niah_single_2", index=0, length=1500):
    config = Config(length=length, count_tokens=lambda text: len(encode_text(tokenizer, text)))
    return generate(task, index, 0, config)


def _probe(diagnosis, length=40, answer=4, value=(11, 12, 13)):
    ids = token_ids(length + answer, seed=3).tolist()
    return diagnosis.Probe(ids[:length], ids[length:], list(value))


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_reading_equals_one_full_forward(tiny, diagnosis, family):
    # the reading goes one token at a time after the first pass; one eager pass over context, question and answer
    # is the reference for the answer's log-probabilities, the last question token's attention and the stream
    model = tiny(family)
    probe = _probe(diagnosis)
    reading = diagnosis.read(model, probe)
    length = len(probe.ids)
    with diagnosis.attention_implementation(model, "eager"), torch.no_grad():
        out = model(torch.tensor(probe.ids + probe.answer)[None], output_attentions=True, output_hidden_states=True)
    expected = out.logits[0, length - 1 : length - 1 + len(probe.answer)].float().log_softmax(-1)
    torch.testing.assert_close(reading.log_probs, expected, atol=1e-5, rtol=1e-5)
    layers = diagnosis.attention_layers(model)
    kinds = getattr(model.config, "layer_types", None) or ["full_attention"] * len(model.model.layers)
    assert sorted(reading.mass) == layers == [i for i, kind in enumerate(kinds) if kind == "full_attention"]
    for layer, attention in zip(layers, out.attentions, strict=True):
        torch.testing.assert_close(reading.mass[layer], attention[0, :, length - 1, probe.value].sum(-1),
                                   atol=1e-5, rtol=1e-5)
    # hidden_states[0] is the embedding, [i + 1] the stream after layer i (the last one after the final norm)
    inner = torch.stack([h[0, :length] for h in out.hidden_states[1:-1]])
    torch.testing.assert_close(reading.stream[:-1], inner, atol=1e-4, rtol=1e-4)
    assert reading.nll(probe.answer) == pytest.approx([-float(expected[i, t]) for i, t in enumerate(probe.answer)])


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_swapped_layer_on_its_own_stream_is_the_models_attention(tiny, diagnosis, family):
    model = tiny(family)
    probe = _probe(diagnosis)
    reading = diagnosis.read(model, probe)
    for layer in (layer for layer in diagnosis.attention_layers(model) if layer > 0):
        torch.testing.assert_close(diagnosis.last_query_mass(model, layer, reading.stream[layer - 1], probe.value),
                                   reading.mass[layer], atol=1e-5, rtol=1e-5)


def test_stream_cosines_of_a_stream_to_itself_and_to_its_negative(diagnosis):
    stream = torch.randn(3, 7, 5, generator=torch.Generator().manual_seed(0))
    same = diagnosis.stream_cosines(stream, stream, [2, 3])
    assert all(v == pytest.approx(1.0) for values in same.values() for v in values)
    opposite = diagnosis.stream_cosines(-stream, stream, [2, 3])
    assert all(v == pytest.approx(-1.0) for values in opposite.values() for v in values)


def test_moving_the_needle_keeps_the_haystack(tokenizer, diagnosis):
    item = _item(tokenizer)
    needle = item.questions[0].needles[0]
    rest = diagnosis.without_needle(item.body, needle)
    assert needle not in rest and len(rest) == len(item.body) - len(needle) - 1
    for start in diagnosis.sentence_starts(rest):
        moved = diagnosis.insert_needle(rest, needle, start)
        assert moved.count(needle) == 1 and diagnosis.without_needle(moved, needle) == rest
    with pytest.raises(ValueError, match="occurs 0 times"):
        diagnosis.without_needle(rest, needle)
    with pytest.raises(ValueError, match="occurs 2 times"):
        diagnosis.without_needle(item.body + " " + needle, needle)


@pytest.mark.parametrize("form", ["chatml", "plain"])
@pytest.mark.parametrize("distance", [60, 400, 1100])
def test_placed_needle_is_at_the_nearest_sentence_boundary(tokenizer, diagnosis, form, distance):
    item = _item(tokenizer)
    question = item.questions[0]
    placed = diagnosis.placed(tokenizer, item, question, form, distance)
    rest = diagnosis.without_needle(item.body, question.needles[0])
    every = [diagnosis.probe(tokenizer, item, question, diagnosis.insert_needle(rest, question.needles[0], s), form)
             for s in diagnosis.sentence_starts(rest)]
    assert abs(placed.distance - distance) == min(abs(p.distance - distance) for p in every)
    assert tokenizer.decode([placed.ids[i] for i in placed.value]) == question.answers[0]
    assert tokenizer.decode(placed.answer) == " " + question.answers[0]


def test_chatml_probe_is_the_bench_question_and_plain_has_no_template(tokenizer, diagnosis):
    from teacher_layer_split import questions  # imported by the module fixture's path

    item = _item(tokenizer, "niah_multikey_1", 1)
    chatml = diagnosis.probe(tokenizer, item, item.questions[0], item.body, "chatml")
    (reference,) = questions(tokenizer, ["niah_multikey_1"], range(1, 2), 1500, "generated")
    assert chatml.ids == reference["ids"][0].tolist() and chatml.value == reference["needle"]
    plain = diagnosis.probe(tokenizer, item, item.questions[0], item.body, "plain")
    text = tokenizer.decode(plain.ids)
    assert "<|im_" not in text and text.endswith(item.questions[0].prefix.strip())
    assert tokenizer.decode([plain.ids[i] for i in plain.value]) == item.questions[0].answers[0]
    with pytest.raises(UsageError, match="unknown question format 'json'"):
        diagnosis.probe(tokenizer, item, item.questions[0], item.body, "json")


def test_wilson_reproduces_the_model_cards_intervals(diagnosis):
    # models/smollm2-135m-hybrid/README.md: 45 / 50 -> [78.6, 95.7], 19 / 50 -> [25.9, 51.8], 0 / 50 -> [0, 7.1]
    for successes, (low, high) in ((45, (0.786, 0.957)), (19, (0.259, 0.518)), (0, (0.0, 0.071))):
        assert diagnosis.wilson(successes, 50) == pytest.approx((low, high), abs=6e-4)
    with pytest.raises(ValueError, match="0 <= successes <= n"):
        diagnosis.wilson(3, 2)


def test_bootstrap_interval_holds_the_mean_and_collapses_on_a_constant(diagnosis):
    values = torch.randn(30, generator=torch.Generator().manual_seed(0)).tolist()
    low, high = diagnosis.bootstrap_mean(values)
    assert low < sum(values) / len(values) < high
    assert diagnosis.bootstrap_mean(values) == (low, high)  # seeded
    assert diagnosis.bootstrap_mean([2.5] * 8) == (2.5, 2.5)


def test_resuming_refuses_rows_of_other_settings_or_a_broken_line(tmp_path, diagnosis):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"key": "a", "settings": {"length": 2048}}) + "\n")
    assert diagnosis.done_keys(rows, {"length": 2048}) == {"a"}
    with pytest.raises(UsageError, match="other settings"):
        diagnosis.done_keys(rows, {"length": 4096})
    rows.write_text(rows.read_text() + '{"key": "b", "sett')
    with pytest.raises(UsageError, match=":2: not a JSON row"):
        diagnosis.done_keys(rows, {"length": 2048})


def _row(set_, item, form, target, nll, exact, mass):
    """A row of ``run`` with every model's answer NLL ``nll[m]`` (one token), ``exact[m]`` and needle mass
    ``mass[m]`` on both heads of kept layers 7 and 8."""
    models = {m: {"nll": [nll[m]], "exact": exact[m], "mass": {"7": [mass[m], 0.0], "8": [0.0, 0.0]},
                  "cos_value": [1.0], "cos_last": [1.0], "cos_all": [1.0]} for m in nll}
    return {"set": set_, "task": "niah_single_2", "item": item, "format": form, "target": target,
            "distance": target or 500, "models": models, "seconds": 10.0, "cpu_seconds": 9.0}


def test_summary_pairs_formats_and_distances_by_item(diagnosis):
    right, wrong = {"teacher": True, "hybrid": False, "split": True}, {"teacher": True, "hybrid": True, "split": False}
    rows = [_row("bench", 0, "chatml", None, {"teacher": 0.1, "hybrid": 5.0, "split": 1.0}, right,
                 {"teacher": 0.8, "hybrid": 0.2, "split": 0.5}),
            _row("bench", 1, "chatml", None, {"teacher": 0.3, "hybrid": 1.0, "split": 2.0}, wrong,
                 {"teacher": 0.6, "hybrid": 0.4, "split": 0.1})]
    for item in (0, 1):
        for form, shift in (("chatml", 0.0), ("plain", -1.0)):
            for target, far in ((100, 0.0), (2000, 2.0)):
                nll = {"teacher": 0.2, "hybrid": 4.0 + shift + far + item, "split": 1.0 + far}
                rows.append(_row("moved", item, form, target, nll, right, {m: 0.5 for m in nll}))
    summary = diagnosis.summarise(rows, {})
    assert summary["kept_layers"] == [7, 8] and summary["cpu_hours"] == pytest.approx(10 * 9.0 / 3600)
    assert summary["bench"]["hybrid"]["accuracy"]["accuracy"] == 0.5
    assert summary["bench"]["hybrid"]["answer_nll"]["mean"] == pytest.approx(3.0)
    assert summary["bench"]["hybrid"]["kept_mass_right"] == pytest.approx(0.4)
    assert summary["bench"]["hybrid"]["kept_mass_wrong"] == pytest.approx(0.2)
    assert summary["mass"]["teacher"]["best_head"] == pytest.approx([0.7, 0.0])
    hybrid = summary["format"]["hybrid"]
    assert hybrid["n"] == 4 and hybrid["plain_minus_chatml_nll"]["mean"] == pytest.approx(-1.0)
    assert summary["far_minus_near_nll"]["hybrid"]["mean"] == pytest.approx(2.0)
    assert summary["far_minus_near_nll"]["teacher"]["mean"] == pytest.approx(0.0)
    assert summary["distance"]["chatml/2000"]["hybrid"]["answer_nll"]["mean"] == pytest.approx(6.5)

"""Children answered as one padded batch = each child answered alone (ragged, dense, different fractions)."""

import pytest
import torch

import presses
from runtime import prefill
from runtime.batch import answer_and_follow_many, answer_many, logits_many
from tests.helpers import FAMILIES, token_ids


@pytest.mark.parametrize("family", [*FAMILIES, "granitemoehybrid-top2"])
def test_batch_equals_each_child_alone(tiny, family):
    model = tiny(family)
    parent = prefill(model, token_ids(150, 0), protected=4)
    selection = presses.Selection(parent, "keydiff")
    # dense and ragged children of different sizes, and a keep-all child, in one batch
    children = [selection.fork("flat", 0.1), selection.fork("pyramid", 0.5), selection.fork("adakv", 0.3),
                parent.fork(parent.keep_all_plan())]
    question = token_ids(9, 1)
    together = logits_many(children, question)
    for b, child in enumerate(children):
        assert torch.allclose(together[b], child.logits(question), atol=1e-5, rtol=0), b
    answers = answer_many(children, question, 7, eos_token_id=5)
    assert [a.tokens for a in answers] == [child.answer(question, 7, eos_token_id=5).tokens for child in children]


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3"])
@pytest.mark.parametrize("forced", [1, 6])
def test_answers_and_a_forced_continuation_from_one_question_pass(tiny, family, forced):
    model = tiny(family)
    parent = prefill(model, token_ids(120, 5), protected=4)
    selection = presses.Selection(parent, "keydiff")
    children = [selection.fork("flat", 0.2), selection.fork("adakv", 0.4)]
    question, continuation = token_ids(8, 6), token_ids(forced, 7)
    answers, logits = answer_and_follow_many(children, question, continuation, 5, eos_token_id=5)
    assert [a.tokens for a in answers] == [a.tokens for a in answer_many(children, question, 5, eos_token_id=5)]
    # logits[:, i] predicts continuation token i: the question's last position, then the forced tokens but the last
    expected = logits_many(children, torch.cat([question, continuation]))[:, question.numel() - 1 : -1]
    assert logits.shape == expected.shape
    assert torch.allclose(logits, expected, atol=1e-5, rtol=0)


def test_batch_refuses_children_of_different_contexts(tiny):
    model = tiny("qwen3_5")
    a = prefill(model, token_ids(40, 2))
    b = prefill(model, token_ids(40, 3))
    with pytest.raises(ValueError, match="same prefilled context"):
        answer_many([a.fork(a.keep_all_plan()), b.fork(b.keep_all_plan())], token_ids(3, 4), 2)


@pytest.mark.parametrize("family", ["qwen3_5", "llama"])
def test_one_padded_batch_for_several_questions_and_members(tiny, family):
    # questions of 20 tokens take the explicit-logits path over the padded cache (FUSED_MIN_QUERIES is 16); the batch
    # is padded once and answers any subset of its children, each as that child alone
    from runtime.batch import PaddedBatch

    model = tiny(family)
    parent = prefill(model, token_ids(160, 8), protected=4)
    selection = presses.Selection(parent, "keydiff")
    children = [selection.fork("flat", 0.1), selection.fork("adakv", 0.3), selection.fork("pyramid", 0.6)]
    batch = PaddedBatch(children)
    for question, members in ((token_ids(20, 9), None), (token_ids(23, 10), [2, 0])):
        answers, logits = batch.answer_and_follow(question, token_ids(4, 11), 6, eos_token_id=5, members=members)
        for answer, follow, b in zip(answers, logits, members or range(3)):
            alone = children[b]
            assert answer.tokens == alone.answer(question, 6, eos_token_id=5).tokens
            expected = alone.logits(torch.cat([question, token_ids(4, 11)]))[question.numel() - 1 : -1]
            assert torch.allclose(follow, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["qwen3_5", "granitemoehybrid"])
def test_sampled_continuations_together_equal_each_alone(tiny, family):
    # the labelling's M sampled futures of one parent: each member its own first token and its own seeded sampler
    from gatesight_learning.labels import Sampler
    from runtime.batch import PaddedBatch

    model = tiny(family)
    parent = prefill(model, token_ids(90, 12), protected=4)
    first = [3, 8, 3]
    together = PaddedBatch([parent] * 3).sample(first, 9, eos_token_id=5,
                                                choose=[Sampler(temperature=2.0, seed=s) for s in range(3)])
    alone = [parent.answer(torch.tensor([t]), 9, eos_token_id=5, choose=Sampler(temperature=2.0, seed=s)).tokens
             for s, t in enumerate(first)]
    assert [a.tokens for a in together] == alone
    assert len({tuple(t) for t in alone}) == 3  # the samplers drew different continuations: the check is not vacuous
    with pytest.raises(ValueError, match="one first token"):
        PaddedBatch([parent] * 3).sample([1, 2], 4)

"""Children answered as one padded batch = each child answered alone (ragged, dense, different fractions, different
contexts)."""

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


@pytest.mark.parametrize("family", ["qwen3_5", "llama", "granitemoehybrid"])
def test_children_of_different_contexts_each_go_on_from_their_own_position(tiny, family):
    # contexts of 40, 71 and 55 tokens (a compacted fork among them): each child's question and continuation sit at
    # its own RoPE positions, so the batch equals each alone — greedy, forced and sampled
    from gatesight_learning.labels import Sampler
    from runtime.batch import PaddedBatch

    model = tiny(family)
    parents = [prefill(model, token_ids(n, seed), protected=4) for n, seed in ((40, 2), (71, 3), (55, 13))]
    children = [parents[0], presses.Selection(parents[1], "keydiff").fork("flat", 0.4), parents[2]]
    question = token_ids(6, 4)
    together = logits_many(children, question)
    for b, child in enumerate(children):
        assert torch.allclose(together[b], child.logits(question), atol=1e-5, rtol=0), b
    answers, follow = answer_and_follow_many(children, question, token_ids(3, 14), 5, eos_token_id=5)
    assert [a.tokens for a in answers] == [c.answer(question, 5, eos_token_id=5).tokens for c in children]
    expected = [c.logits(torch.cat([question, token_ids(3, 14)]))[question.numel() - 1 : -1] for c in children]
    assert torch.allclose(follow, torch.stack(expected), atol=1e-5, rtol=0)
    first = [3, 8, 3]
    sampled = PaddedBatch(children).sample(first, 8, eos_token_id=5,
                                           choose=[Sampler(temperature=2.0, seed=s) for s in range(3)])
    alone = [c.answer(torch.tensor([t]), 8, eos_token_id=5, choose=Sampler(temperature=2.0, seed=s)).tokens
             for s, (c, t) in enumerate(zip(children, first))]
    assert [a.tokens for a in sampled] == alone


def test_batch_refuses_children_of_different_models(tiny):
    a = prefill(tiny("qwen3_5"), token_ids(40, 2))
    b = prefill(tiny("llama"), token_ids(40, 3))
    with pytest.raises(ValueError, match="same model"):
        answer_many([a, b], token_ids(3, 4), 2)


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


@pytest.mark.parametrize("family", ["qwen3_5", "llama", "granitemoehybrid"])
def test_forks_into_their_places_are_the_batch_of_the_children(tiny, family):
    # one child at a time into a batch sized from the plans: the same tensors as padding the children, each child
    # shown before it is released
    from runtime.batch import PaddedBatch

    parent = prefill(tiny(family), token_ids(150, 0), protected=4)
    selection = presses.Selection(parent, "keydiff")
    plans = [selection.plan("flat", 0.1), selection.plan("pyramid", 0.5), selection.plan("adakv", 0.3)]
    seen = []
    forked = PaddedBatch.forks(parent, plans, lambda i, child: seen.append((i, child, child.kv_nbytes)))
    children = [parent.fork(plan) for plan in plans]
    padded = PaddedBatch(children)
    assert [i for i, _, _ in seen] == [0, 1, 2] and all(child.released for _, child, _ in seen)
    assert [nbytes for _, _, nbytes in seen] == [child.kv_nbytes for child in children]
    assert forked.position == padded.position == parent.n and forked.size == 3
    for mine, theirs in ((forked.base, padded.base), (forked.recurrent, padded.recurrent)):
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(a, b) and a.dtype == b.dtype
                   for layer in mine for a, b in zip(mine[layer], theirs[layer]))
    with pytest.raises(ValueError, match="at least one plan"):
        PaddedBatch.forks(parent, [])


@pytest.mark.parametrize("family", ["qwen3_5", "llama", "granitemoehybrid"])
def test_the_memory_estimate_is_the_padded_batch_and_a_child(tiny, family):
    # against the real tensors: the padded copy, and the largest child forked into it (dense and ragged heads, a
    # protected prefix, recurrent states); what answering adds grows with the question and answer tokens
    from runtime.batch import PaddedBatch
    from runtime.batch_memory import batch_nbytes

    parent = prefill(tiny(family), token_ids(150, 0), protected=4)
    selection = presses.Selection(parent, "keydiff")
    plans = [selection.plan("flat", 0.1), selection.plan("pyramid", 0.5), selection.plan("adakv", 0.3)]
    children = [parent.fork(plan) for plan in plans]
    batch = PaddedBatch(children)
    estimate = batch_nbytes(parent, [plan.counts() for plan in plans], 0)
    assert estimate.padded == sum(t.nbytes for tensors in (*batch.base.values(), *batch.recurrent.values())
                                  for t in tensors)
    def held(child):
        positions = [kv.positions if kv.ragged else [kv.positions] for kv in child.kv.values()]
        return child.kv_nbytes + child.recurrent_nbytes + sum(p.nbytes for heads in positions for p in heads)

    assert estimate.child == max(held(child) for child in children)
    assert estimate.peak == estimate.padded + max(estimate.child, estimate.answering)
    longer = batch_nbytes(parent, [plan.counts() for plan in plans], 40)
    forced = batch_nbytes(parent, [plan.counts() for plan in plans], 40, forced=10)
    assert (longer.padded, longer.child) == (forced.padded, forced.child) == (estimate.padded, estimate.child)
    assert estimate.answering < longer.answering
    # ten kept rows of logits and log-probabilities where a step keeps one, for each of the three members
    assert forced.answering - longer.answering == 3 * 9 * parent.last_logits.shape[-1] * 8


def test_groups_are_consecutive_as_long_as_the_budget_allows(tiny):
    from runtime.batch_memory import batch_nbytes, groups_within

    parent = prefill(tiny("qwen3_5"), token_ids(150, 0), protected=4)
    selection = presses.Selection(parent, "keydiff")
    plans = [(p, selection.plan(allocator, p)) for p in (0.1, 0.2, 0.3, 0.5, 0.6, 0.9)
             for allocator in ("flat", "pyramid")]
    counts = {id(plan): plan.counts() for _, plan in plans}

    def size(group):
        return batch_nbytes(parent, [counts[id(plan)] for _, plan in group], 30).peak

    budget = size(plans[:3])
    groups = list(groups_within(parent, plans, 30, budget=budget))
    assert [tag for group in groups for tag, _ in group] == [tag for tag, _ in plans]
    assert 1 < len(groups) < len(plans)  # neither one batch nor one child each: the check below is not vacuous
    for group, after in zip(groups, groups[1:] + [None]):
        assert len(group) == 1 or size(group) <= budget
        if after is not None:  # the group could not take the next plan
            assert size(group + after[:1]) > budget
    at_most_two = [len(g) for g in groups_within(parent, plans, 30, budget=budget, most=2)]
    assert max(at_most_two) == 2 and sum(at_most_two) == len(plans)
    assert [len(g) for g in groups_within(parent, plans, 30, budget=1)] == [1] * len(plans)  # over budget alone: alone


def test_groups_read_the_plans_one_past_the_group(tiny):
    from runtime.batch_memory import groups_within

    parent = prefill(tiny("llama"), token_ids(80, 0), protected=4)
    plan = presses.Selection(parent, "keydiff").plan("flat", 0.5)
    made = []

    def plans():
        for i in range(5):
            made.append(i)
            yield i, plan

    groups = groups_within(parent, plans(), 10, budget=1)
    assert next(groups) == [(0, plan)] and made == [0, 1]
    assert next(groups) == [(1, plan)] and made == [0, 1, 2]


@pytest.mark.parametrize("change, message", [({"budget": 0}, "the memory budget .* >= 1, got 0"),
                                             ({"budget": 2.5}, "the memory budget .* got 2.5"),
                                             ({"most": 0}, "children answered together must be .* >= 1"),
                                             ({"tokens": -1}, "tokens must be an integer >= 0"),
                                             ({"forced": -1}, "forced must be an integer >= 0")])
def test_groups_refuse_a_bad_budget_before_any_plan_is_made(tiny, change, message):
    from runtime.batch_memory import groups_within
    from runtime.errors import UsageError

    parent = prefill(tiny("llama"), token_ids(40, 0))
    made = []

    def plans():
        made.append(0)
        yield 0, parent.keep_all_plan()

    arguments = {"tokens": 10, "forced": 0, "budget": 2**20, "most": None, **change}
    with pytest.raises(UsageError, match=message):
        groups_within(parent, plans(), **arguments)
    assert made == []

"""Fidelity metrics: exactly zero for a keep-all child, and they see the needle being evicted."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bench.run.fidelity import FullCacheReference, answer_log_probs, fidelity, reference_text
from pretrained.loading import DEFAULT_MODEL_DIR
from runtime import KeepPlan, encode_text, prefill
from workloads.tasks import Config, generate


def _reference(cache, prompt, answer):
    return FullCacheReference(answer, answer_log_probs(cache, prompt, answer), cache.answer(prompt, 4).tokens)


def _setting(tiny, seed, n, prompt_len, answer_len):
    """A parent of the tiny hybrid, a prompt, an answer and the full cache's reference for them."""
    torch.manual_seed(seed)
    parent = prefill(tiny("qwen3_5"), torch.randint(0, 97, (n,)), protected=4)
    prompt, answer = torch.randint(0, 97, (prompt_len,)), torch.randint(0, 97, (answer_len,))
    return parent, prompt, answer, _reference(parent, prompt, answer)


def test_keep_all_child_changes_nothing(tiny):
    parent, prompt, answer, reference = _setting(tiny, 0, 120, 7, 5)
    child = parent.fork(parent.keep_all_plan())
    row = fidelity(reference, answer_log_probs(child, prompt, answer), child.answer(prompt, 4).tokens)
    assert row["delta_nll"] == 0.0 and row["kl"] == 0.0 and row["agree"] is True
    assert row["answer_nll"] == pytest.approx(reference.answer_nll) and row["answer_nll"] > 0


def test_fidelity_matches_a_hand_computation(tiny):
    parent, prompt, answer, reference = _setting(tiny, 1, 90, 6, 3)
    keep = [torch.arange(4, 90, 3) for _ in range(2)]
    child = parent.fork(KeepPlan({layer: keep for layer in parent.adapter.attention_layers}))
    child_lp = answer_log_probs(child, prompt, answer)
    row = fidelity(reference, child_lp, [-1])
    # brute force: the same quantities from the logits of one pass each
    full_logits = parent.logits(torch.cat([prompt, answer]))[5:8].double()
    child_logits = child.logits(torch.cat([prompt, answer]))[5:8].double()
    p, q = full_logits.softmax(-1), child_logits.softmax(-1)
    nll = -q.log()[torch.arange(3), answer].sum()
    assert row["answer_nll"] == pytest.approx(float(nll), rel=1e-5)
    assert row["delta_nll"] == pytest.approx(float(nll + p.log()[torch.arange(3), answer].sum()), abs=1e-4)
    assert row["kl"] == pytest.approx(float((p * (p.log() - q.log())).sum(-1).mean()), abs=1e-5)
    assert row["kl"] > 0 and row["agree"] is False


def test_reference_text_follows_the_answer_prefix():
    assert reference_text("Answer:", "1234") == " 1234"
    assert reference_text("Answer: ", "1234") == "1234"
    assert reference_text("", "1234") == "1234"


def _span(context: str, tokenizer, value: str) -> tuple[int, int]:
    """Token positions ``[start, end)`` of the sentence that holds ``value``."""
    at = context.index(value)
    start = max(context.rfind("\n", 0, at), context.rfind(". ", 0, at) + 1) + 1
    end = context.index(".", at) + 1
    return len(encode_text(tokenizer, context[:start])), len(encode_text(tokenizer, context[:end]))


def test_dropping_the_needle_costs_far_more_than_dropping_haystack():
    """On the shipped model: a child without the needle's entries (every layer and head) loses the answer's
    likelihood; a child without as many haystack entries far from the needle barely changes it."""
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True)
    count = lambda text: len(encode_text(tokenizer, text))  # noqa: E731
    item = generate("niah_single_1", 0, 0, Config(length=1024, count_tokens=count))
    question = item.questions[0]
    ids = torch.tensor(encode_text(tokenizer, item.context))
    protected = count(item.protected_text)
    parent = prefill(model, ids, protected=protected, tokenizer=tokenizer)
    prompt = torch.tensor(encode_text(tokenizer, question.prompt))
    answer = torch.tensor(encode_text(tokenizer, reference_text(question.prefix, question.answers[0])))
    reference = _reference(parent, prompt, answer)
    start, end = _span(item.context, tokenizer, question.answers[0])
    width = end - start
    # the same number of haystack entries, as far from the needle as the body allows
    far = protected if start - protected > parent.n - end else parent.n - width
    assert far + width <= start or far >= end

    def without(a, b):
        body = torch.arange(protected, parent.n)
        kept = body[(body < a) | (body >= b)]
        child = parent.fork(KeepPlan({layer: [kept] * 2 for layer in parent.adapter.attention_layers}))
        return fidelity(reference, answer_log_probs(child, prompt, answer), [])["delta_nll"]

    needle, haystack = without(start, end), without(far, far + width)
    assert reference.answer_nll < 2.0  # the full cache knows the answer
    assert needle > 5.0, (needle, haystack)
    assert abs(haystack) < 0.5, (needle, haystack)

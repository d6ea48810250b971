"""Answering throughput of the bench protocol on the shipped model at 4K tokens (``pytest benchmarks
--benchmark-enable -k answer``): one NIAH context, its question answered greedily from a p = 0.1 child, as
``bench compare`` does for every (press, allocator, ratio). Questions per second = 1 / the mean time."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import presses
from pretrained.loading import DEFAULT_MODEL_DIR
from runtime import encode_text, prefill
from workloads.tasks import Config, generate


@pytest.fixture(scope="module")
def setting():
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True)
    item = generate("niah_single_1", 0, 0, Config(length=4096, count_tokens=lambda t: len(encode_text(tokenizer, t))))
    press = presses.get("keydiff")
    parent = prefill(model, torch.tensor(encode_text(tokenizer, item.context)),
                     protected=len(encode_text(tokenizer, item.protected_text)), evidence=press.evidence(None))
    child = presses.Selection(parent, press).fork("flat", 0.1)
    question = item.questions[0]
    return child, torch.tensor(encode_text(tokenizer, question.prompt)), question.max_new_tokens, tokenizer


def test_answer_one_question_at_4k(benchmark, setting):
    child, prompt, max_new, tokenizer = setting
    benchmark.group = "answer throughput, 4K tokens, p = 0.1"
    # always the full answer budget (no early stop at EOS), so every round decodes the same number of tokens
    benchmark.pedantic(lambda: child.answer(prompt, max_new), rounds=5, warmup_rounds=1)


def _protocol_context():
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True)
    item = generate("niah_single_1", 0, 0, Config(length=4096, count_tokens=lambda t: len(encode_text(tokenizer, t))))
    parent = prefill(model, torch.tensor(encode_text(tokenizer, item.context)),
                     protected=len(encode_text(tokenizer, item.protected_text)), tokenizer=tokenizer)
    selection = presses.Selection(parent, "keydiff")
    kids = [selection.fork(alloc, p) for alloc in ("flat", "pyramid") for p in (0.02, 0.05, 0.1, 0.2, 0.4, 0.7)]
    question = item.questions[0]
    prompt = torch.tensor(encode_text(tokenizer, question.prompt))
    answer = torch.tensor(encode_text(tokenizer, " " + question.answers[0]))
    return parent, kids, prompt, answer, question.max_new_tokens, tokenizer.eos_token_id


@pytest.fixture(scope="module")
def protocol():
    return _protocol_context()


def test_protocol_answering_before(benchmark, protocol):
    """One question of one context as ``bench compare`` answered it when issue 21 was filed: the full cache's
    reference (a greedy decode, then a teacher-forced pass), the no-prune child decoded again, and the children's
    greedy decode and teacher-forced pass as two batches. Questions per second = 13 / the mean time."""
    from bench.run.fidelity import answer_log_probs
    from runtime.batch import answer_many, logits_many

    parent, kids, prompt, answer, max_new, eos = protocol
    benchmark.group = "protocol: 13 children of a 4K context, one question"

    def before():
        parent.answer(prompt, max_new, eos), answer_log_probs(parent, prompt, answer)
        full = parent.fork(parent.keep_all_plan())
        full.answer(prompt, max_new, eos), answer_log_probs(full, prompt, answer)
        full.release()
        answer_many(kids, prompt, max_new, eos), logits_many(kids, torch.cat([prompt, answer]))

    benchmark.pedantic(before, rounds=3, warmup_rounds=1)


def test_protocol_answering_after(benchmark, protocol):
    """The same question now: one pass over the question feeds the greedy answer and the teacher-forced reference,
    for the full cache (whose answer is also the no-prune row's) and for the children as one batch."""
    from runtime.batch import answer_and_follow_many

    parent, kids, prompt, answer, max_new, eos = protocol
    benchmark.group = "protocol: 13 children of a 4K context, one question"

    def after():
        answer_and_follow_many([parent], prompt, answer, max_new, eos)
        answer_and_follow_many(kids, prompt, answer, max_new, eos)

    benchmark.pedantic(after, rounds=3, warmup_rounds=1)

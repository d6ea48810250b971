"""Answering throughput of the bench protocol on the shipped model at 4K tokens (``pytest benchmarks
--benchmark-enable -k answer``): one NIAH context, its question answered greedily from a p = 0.1 child, as
``bench compare`` does for every (press, allocator, ratio). Questions per second = 1 / the mean time."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import presses
from bench.loading import DEFAULT_MODEL_DIR
from bench.tasks import Config, generate
from runtime import encode_text, prefill


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

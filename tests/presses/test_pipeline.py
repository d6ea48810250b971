"""The kvpress-shaped pipeline: the task framing through the chat template, one prefill, one child, every question."""

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import presses
from pretrained.loading import DEFAULT_MODEL_DIR
from runtime import CHATML_ASSISTANT_TURN, encode_text, prefill
from workloads.metrics import string_match_all
from workloads.tasks import Config, generate


def _load(directory):
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True).eval()
    return model, AutoTokenizer.from_pretrained(directory, local_files_only=True)


def test_pipeline_equals_the_protocol_by_hand(model_dir):
    model, tokenizer = _load(model_dir)
    pipe = presses.pipeline(model, tokenizer, max_new_tokens=6)
    context, questions = "Some facts.\n\nThe code is 4711.", ["\n\nWhat is the code?", "\n\nSay it again."]
    answers = pipe(context, questions=questions, press="keydiff", allocator="pyramid", compression_ratio=0.6)
    # by hand: kvpress's ChatML framing (the question right after the context), Selection + fork, each question
    prefix = encode_text(tokenizer, "<|im_start|>user\n")
    ids = torch.tensor(prefix + encode_text(tokenizer, context))
    parent = prefill(model, ids, protected=len(prefix), tokenizer=tokenizer)
    child = presses.Selection(parent, "keydiff").fork("pyramid", 0.4)
    expected = [child.answer(torch.tensor(encode_text(tokenizer, q + CHATML_ASSISTANT_TURN)), 6,
                             tokenizer.eos_token_id).text for q in questions]
    assert answers == expected
    assert pipe(context, questions[0], press="keydiff", keep_fraction=0.4, allocator="pyramid") == expected[0]


def test_pipeline_answers_a_needle_on_the_shipped_model():
    model, tokenizer = _load(DEFAULT_MODEL_DIR)
    item = generate("niah_single_1", 1, 0, Config(length=1024, count_tokens=lambda t: len(encode_text(tokenizer, t))))
    question = item.questions[0]
    answer = presses.pipeline(model, tokenizer, max_new_tokens=question.max_new_tokens)(
        item.header + "\n\n" + item.body + "\n\n", [question.text], press="keydiff", compression_ratio=0.5,
        answer_prefix=question.prefix)
    assert string_match_all(answer[0], question.answers) == 1.0, (answer, question.answers)

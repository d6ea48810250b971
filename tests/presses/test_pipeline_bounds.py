"""The pipelines check a request before any work: ``questions`` a non-empty list of strings (a string is not taken
character by character, an empty list is no question), the budget a number, and the context, the longest question
and ``max_new_tokens`` within the model's positions (a model that never emits EOS would decode for as long as it
is told to)."""

import re
import sys

import numpy as np
import pytest
from transformers import pipeline

import presses
import presses.kvpress_pipeline  # noqa: F401 - registers the task
from presses.kvpress_pipeline import TASK
from runtime.errors import ArgumentTypeError, UsageError

CONTEXT, QUESTION = "Some facts. The code is 4711.", "\nWhat is the code?"


@pytest.fixture(scope="module")
def pipe(model_dir):
    return pipeline(TASK, model=str(model_dir), device="cpu")


@pytest.fixture
def no_prefill(monkeypatch):
    # the module, not the function presses.pipeline that shadows it in the package
    monkeypatch.setattr(sys.modules["presses.pipeline"], "prefill",
                        lambda *a, **k: pytest.fail("the context was prefilled"))


@pytest.mark.parametrize("arguments, error, message", [
    ({"questions": "What is the code?"}, TypeError, "questions must be a list of strings \\(one question: question="),
    ({"questions": []}, ValueError, "questions is empty"),
    ({"questions": ["\nWho?", 3]}, TypeError, "questions must be a list of strings"),
    ({"question": 5}, TypeError, "question must be a string, got int 5"),
    ({"question": QUESTION, "compression_ratio": "0.5"}, TypeError, "compression_ratio must be a number.*str '0.5'"),
    ({"question": QUESTION, "compression_ratio": None, "keep_fraction": True}, TypeError, "keep_fraction must be a "
                                                                                          "number"),
    ({"question": QUESTION, "max_new_tokens": 10**9}, ValueError, "positions; the model has 32768"),
    ({"question": QUESTION, "max_new_tokens": 0}, ValueError, "max_new_tokens must be an integer >= 1, got 0"),
])
def test_the_task_refuses_a_request_before_any_work(pipe, no_prefill, arguments, error, message):
    arguments = {"press": "keydiff", "compression_ratio": 0.5, **arguments}
    with pytest.raises(error, match=message):
        pipe(CONTEXT, **arguments)


def test_the_library_pipeline_checks_the_same_bounds(pipe, no_prefill):
    ours = presses.pipeline(pipe.model, pipe.tokenizer, max_new_tokens=10**9)
    with pytest.raises(ValueError, match="positions; the model has 32768 \\(max_position_embeddings\\)"):
        ours(CONTEXT, QUESTION, press="keydiff", compression_ratio=0.5)
    with pytest.raises(TypeError, match="compression_ratio must be a number"):
        presses.pipeline(pipe.model, pipe.tokenizer)(CONTEXT, QUESTION, press="keydiff", compression_ratio=[0.5])


def test_the_positions_bound_is_the_context_the_longest_question_and_the_answer(pipe, monkeypatch):
    ids = pipe.preprocess(CONTEXT, questions=[QUESTION, "\nAnd?"], answer_prefix="", max_context_length=10**6,
                          enable_thinking=False, protected=0)
    needed = len(ids["context_ids"]) + len(ids["questions_ids"][0])
    monkeypatch.setattr(pipe.model.config, "max_position_embeddings", needed + 3)
    answers = pipe(CONTEXT, questions=[QUESTION, "\nAnd?"], press="keydiff", compression_ratio=0.5,
                   max_new_tokens=3)["answers"]
    assert len(answers) == 2  # two questions, two answers: none of a question never asked
    with pytest.raises(ValueError, match=f"need {needed + 4} positions; the model has {needed + 3} "
                                         "\\(max_position_embeddings\\): give max_new_tokens <= 3"):
        pipe(CONTEXT, questions=[QUESTION, "\nAnd?"], press="keydiff", compression_ratio=0.5, max_new_tokens=4)


@pytest.mark.parametrize("context, shown", [(None, "NoneType None"), (123, "int 123"), (b"bytes", "bytes b'bytes'")])
def test_a_context_that_is_not_text_is_named_by_both_pipelines(pipe, no_prefill, context, shown):
    message = f"context must be a string \\(the text to compress\\), got {shown}"
    with pytest.raises(ArgumentTypeError, match=message):
        pipe(context, question=QUESTION, press="keydiff", compression_ratio=0.5)
    with pytest.raises(ArgumentTypeError, match=message):
        presses.pipeline(pipe.model, pipe.tokenizer)(context, QUESTION, press="keydiff", compression_ratio=0.5)


@pytest.mark.parametrize("arguments, error, message", [
    ({"answer_prefix": 5}, ArgumentTypeError, "answer_prefix must be a string, got int 5"),
    ({"max_context_length": -1}, UsageError, "max_context_length must be an integer >= 1, got -1"),
    ({"max_context_length": 0}, UsageError, "max_context_length must be an integer >= 1, got 0"),
    ({"max_context_length": 2.5}, UsageError, "max_context_length must be an integer >= 1, got 2.5"),
    ({"max_new_tokens": 2.5}, UsageError, "max_new_tokens must be an integer >= 1, got 2.5"),
    ({"enable_thinking": "no"}, ArgumentTypeError, "enable_thinking must be True or False, got str 'no'"),
    ({"protected": "all"}, UsageError, "protected must be an integer >= 0 or 'header', got 'all'"),
    ({"protected": -1}, UsageError, "protected must be an integer >= 0 or 'header', got -1"),
])
def test_the_tasks_other_arguments_are_checked_before_any_work(pipe, no_prefill, arguments, error, message):
    with pytest.raises(error, match=message):
        pipe(CONTEXT, question=QUESTION, press="keydiff", compression_ratio=0.5, **arguments)


@pytest.mark.parametrize("arguments, message", [
    ({"answer_prefix": 5}, "answer_prefix must be a string, got int 5"),
    ({"layer_weights": 5}, "layer_weights must be a dict {attention layer: weight} or None, got int 5"),
])
def test_the_library_pipelines_other_arguments_are_checked(pipe, no_prefill, arguments, message):
    with pytest.raises(ArgumentTypeError, match=message):
        presses.pipeline(pipe.model, pipe.tokenizer)(CONTEXT, QUESTION, press="keydiff", compression_ratio=0.5,
                                                     **arguments)
    with pytest.raises(UsageError, match="max_new_tokens must be an integer >= 1, got 2.5"):
        presses.pipeline(pipe.model, pipe.tokenizer, max_new_tokens=2.5)


@pytest.mark.parametrize("press, allocator, weights, message", [
    ("keydiff", "flat", {1: 1.0, 3: 1.0}, "layer_weights would be ignored: the 'flat' allocator does not read them"),
    (None, None, {1: 1.0, 3: 1.0}, "layer_weights would be ignored: no allocator \\(nothing is compressed\\)"),
    ("keydiff", "gate", {1: -1.0, 3: 1.0}, "layer_weights\\[1\\] = -1.0: a layer's weight must be a finite number"),
    ("keydiff", "gate", {1: 1.0, 3: 1.0, 9: 1.0}, "layer_weights name layers \\[9\\] that are not attention layers"),
])
def test_layer_weights_that_would_be_ignored_or_cannot_split_are_refused_before_the_prefill(
        pipe, no_prefill, press, allocator, weights, message):
    budget = {"compression_ratio": 0.5} if press is not None else {}
    with pytest.raises(UsageError, match=message):
        presses.pipeline(pipe.model, pipe.tokenizer)(CONTEXT, QUESTION, press=press, allocator=allocator,
                                                     layer_weights=weights, **budget)


@pytest.mark.parametrize("tokenizer, shown", [(None, "NoneType None, which has no chat_template, bos_token, "
                                                     "apply_chat_template, decode, __call__"),
                                               ("gpt2", "str 'gpt2', which has no chat_template")])
def test_a_pipeline_without_a_tokenizer_names_it(pipe, tokenizer, shown):
    with pytest.raises(ArgumentTypeError, match=re.escape(
            f"tokenizer must be the model's transformers tokenizer (AutoTokenizer.from_pretrained; it frames the "
            f"context with its chat template and decodes the answers), got {shown}")):
        presses.pipeline(pipe.model, tokenizer)


@pytest.mark.parametrize("model, shown", [(None, "NoneType None"), ("Qwen/Qwen3-0.6B", "str 'Qwen/Qwen3-0.6B'")])
def test_a_pipeline_without_a_model_names_it(pipe, model, shown):
    from presses.pipeline import CompressedContextPipeline

    for build in (lambda: presses.pipeline(model, pipe.tokenizer),
                  lambda: CompressedContextPipeline(model, pipe.tokenizer)):
        with pytest.raises(ArgumentTypeError, match=re.escape(
                f"model must be a transformers causal LM (AutoModelForCausalLM.from_pretrained) of a family the "
                f"runtime supports, got {shown}")):
            build()


def test_the_context_is_cut_to_max_context_length_tokens(pipe):
    ids = pipe.preprocess(CONTEXT, questions=[QUESTION], answer_prefix="", max_context_length=5,
                          enable_thinking=False, protected=0)
    assert len(ids["context_ids"]) == 5


def test_numpy_numbers_are_numbers_to_both_pipelines(pipe):
    ours = presses.pipeline(pipe.model, pipe.tokenizer, max_new_tokens=np.int64(3))
    expected = presses.pipeline(pipe.model, pipe.tokenizer, max_new_tokens=3)(CONTEXT, QUESTION, press="keydiff",
                                                                             compression_ratio=0.5)
    assert ours(CONTEXT, QUESTION, press="keydiff", compression_ratio=np.float32(0.5)) == expected
    assert ours(CONTEXT, QUESTION, press="keydiff", keep_fraction=np.float64(0.5)) == expected
    assert pipe(CONTEXT, question=QUESTION, press="keydiff", compression_ratio=np.float64(0.5),
                max_new_tokens=np.int32(3), max_context_length=np.int64(1000))["answer"] == expected


def test_a_context_of_no_tokens_past_the_header_is_named_not_its_protected_count(pipe, no_prefill):
    ours = presses.pipeline(pipe.model, pipe.tokenizer, max_new_tokens=2)
    with pytest.raises(UsageError, match="context '' adds no token to the chat template's header"):
        ours("", QUESTION, press="keydiff", compression_ratio=0.5)
    with pytest.raises(UsageError, match=r"protected='header' keeps the chat template's header \(\d+ tokens\), and "
                                         r"the context holds 3 tokens \(max_context_length=3\)"):
        pipe(CONTEXT, question=QUESTION, press="keydiff", compression_ratio=0.5, protected="header",
             max_context_length=3)

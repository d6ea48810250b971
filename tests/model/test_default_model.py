"""The shipped default model loads offline and retrieves at full cache (a broken checkpoint cannot land)."""

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pretrained.loading import DEFAULT_MODEL_DIR
from runtime import adapter_for, encode_text, prefill
from workloads.metrics import string_match_all
from workloads.tasks import Config, generate


def test_default_model_retrieves_needles():
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True)
    adapter = adapter_for(model)
    assert len(adapter.gdn_layers) >= 9 and len(adapter.attention_layers) >= 3
    assert adapter.geometry.num_kv_heads >= 2 and adapter.geometry.rotary_dim < adapter.geometry.head_dim
    assert tokenizer("ab", add_special_tokens=False)["input_ids"] == [97, 98]
    encode = lambda text: torch.tensor(encode_text(tokenizer, text))  # noqa: E731
    count = lambda text: len(encode_text(tokenizer, text))  # noqa: E731
    scores = []
    # fixed held-out items (evaluation seed 0); training used seeds >= 1,000,000. The two tasks the shipped model
    # solves at full cache (100 % at 2K over 20 items): a broken or untrained checkpoint gets none of them. Harder
    # tasks are measured by `bench model-eval` with intervals, not guarded here.
    for task in ("niah_single_1", "niah_single_2"):
        for index in range(4):
            item = generate(task, index, 0, Config(length=1024, count_tokens=count))
            parent = prefill(model, encode(item.context), tokenizer=tokenizer)
            question = item.questions[0]
            answer = parent.answer(encode(question.prompt), question.max_new_tokens, tokenizer.eos_token_id)
            scores.append(string_match_all(answer.text, question.answers))
    assert sum(scores) >= 7, scores  # the trained model gets these right; a random or broken one gets none


def test_shipped_tokenizer_has_the_chatml_template():
    """``apply_chat_template`` gives exactly the ids of the task framing (kvpress's pipeline relies on it)."""
    from runtime import CHATML_ASSISTANT_TURN, encode_text

    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Where?"}], add_generation_prompt=True,
                                        tokenize=True, return_dict=True)["input_ids"]
    assert ids == encode_text(tokenizer, "<|im_start|>user\nWhere?" + CHATML_ASSISTANT_TURN)

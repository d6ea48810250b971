"""The default model's training drills: every labelled answer is the true answer, recomputed from the row's text."""

import math
import random
import re

import pytest

from hybridmodel.data import IGNORE, chains_sequence, needles_sequence
from hybridmodel.tokenizer import build_tokenizer
from hybridmodel.train import TrainConfig, learning_rate


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _turns(tokenizer, seq):
    """(question text, labelled answer text: what follows the answer prefix) of every answered turn of a row."""
    text = tokenizer.decode(seq.ids)
    labelled = "".join(tokenizer.decode([t]) for t, lab in zip(seq.ids, seq.labels) if lab != IGNORE)
    questions = re.findall(r"([^\n]*)<\|im_end\|>\n<\|im_start\|>assistant\n", text)
    answers = [a for a in labelled.split("<|im_end|>\n") if a]
    return text, list(zip(questions, answers))


@pytest.mark.parametrize("length", [512, 1024, 4096])
@pytest.mark.parametrize("seed", range(6))
def test_needles_answers_are_the_haystack_values(tokenizer, length, seed):
    seq = needles_sequence(tokenizer, random.Random(seed), length)
    assert len(seq.ids) == len(seq.labels) <= length
    text, turns = _turns(tokenizer, seq)
    haystack = text.split("\n\n")[1]
    values: dict[str, list[str]] = {}
    for key, value in re.findall(r"^The magic \w+ for (\w+) is (\w+)\.$", haystack, re.M):
        values.setdefault(key, []).append(value)
    assert values and turns
    for question, answer in turns:
        keys = re.findall(r"\b(\w+)\b(?:,|\?| and)", question.split(" for ", 1)[1])
        expected = [v for key in keys for v in values[key]]
        assert answer == " " + ", ".join(expected) + ".", (question, answer)


@pytest.mark.parametrize("length", [1024, 2048])
@pytest.mark.parametrize("seed", range(6))
def test_chain_answers_follow_the_assignments(tokenizer, length, seed):
    seq = chains_sequence(tokenizer, random.Random(seed), length)
    text, turns = _turns(tokenizer, seq)
    assignments = re.findall(r"^VAR (\w+) = (?:VAR )?(\w+)$", text, re.M)
    assert len(turns) == sum(rhs.isdigit() for _, rhs in assignments) >= 2
    for question, answer in turns:
        carried = {re.search(r"equal (\d+)\?", question).group(1)}
        names = []
        for lhs, rhs in assignments:  # in text order: a chain's lines keep their order
            if rhs in carried:
                carried.add(lhs)
                names.append(lhs)
        assert answer == " " + ", ".join(names) + "."


def test_learning_rate_restarts_at_each_phase():
    cfg = TrainConfig(steps=300, phases=((0, 1e-3), (200, 4e-4)), warmup=10)
    assert learning_rate(9, cfg) == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 9 / 200)))
    assert learning_rate(199, cfg) == pytest.approx(5e-5)  # decayed to the floor before the restart
    assert learning_rate(200, cfg) == pytest.approx(4e-5)  # restart: first warm-up step of the second phase
    assert max(learning_rate(s, cfg) for s in range(200, 300)) <= 4e-4
    assert learning_rate(299, cfg) == pytest.approx(2e-5)

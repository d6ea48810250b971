"""Training data for the default model: offline generic text mixed with the project's own task generators.

Generic text comes from :mod:`workloads.corpus` (its training split). Task items use training seeds
(>= ``TRAIN_SEED_BASE``), disjoint from evaluation seeds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from runtime import encode_text
from workloads.corpus import SOURCES, documents
from workloads.tasks import Config, generate
from workloads.tasks.ruler import draw_distinct, needle_text, niah_question, vt_chain, vt_names, vt_question
from workloads.tasks.text import noise_lines, prose_sentences

TRAIN_SEED_BASE = 1_000_000
TRAIN_TASKS = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
               "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2")
IGNORE = -100


@dataclass
class Sequence:
    """One training row before padding.

    Attributes
    ----------
    ids : list[int]
        ``[L]`` input tokens.
    labels : list[int]
        ``[L]`` next-token targets, :data:`IGNORE` where the loss does not look (prompts, haystacks).
    """

    ids: list[int]
    labels: list[int]


def _encode(tokenizer, text: str) -> list[int]:
    return encode_text(tokenizer, text)


def _answer(answers: list[str]) -> str:
    return " " + ", ".join(answers) + "."


def _ask(tokenizer, question, first: bool) -> tuple[list[int], list[int]]:
    """Ids and labels of one chat-format question (in the evaluation's wording) and its answer."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompt = _encode(tokenizer, question.prompt if first else "<|im_start|>user\n" + question.prompt)
    answer = _encode(tokenizer, _answer(question.answers)) + [end] + _encode(tokenizer, "\n")
    return prompt + answer, [IGNORE] * len(prompt) + answer


def task_sequence(tokenizer, rng: random.Random, length: int, task: str | None = None) -> Sequence:
    """One task item (training seed) with all its questions answered, loss on the answers only."""
    task = task or rng.choice(TRAIN_TASKS)
    # leave room for the extra questions appended after the first one
    config = Config(length=int(length * 0.85))
    try:
        item = generate(task, rng.randrange(10**9), TRAIN_SEED_BASE + rng.randrange(10**6), config)
    except ValueError:  # the task does not fit this (short) curriculum length: dense recall instead
        return recall_sequence(tokenizer, rng, length)
    ids = _encode(tokenizer, item.context)
    labels = [IGNORE] * len(ids)
    for k, question in enumerate(item.questions):
        q_ids, q_labels = _ask(tokenizer, question, k == 0)
        ids, labels = ids + q_ids, labels + q_labels
    return Sequence(ids, labels)


def recall_sequence(tokenizer, rng: random.Random, length: int) -> Sequence:
    """Dense supervision: a haystack made only of needles, then questions about random ones (one per 96 tokens)."""
    lines, keys = [], []
    queries = max(2, min(12, length // 96))
    budget = length - queries * 45
    text = "<|im_start|>user\nRemember the magic numbers.\n\n"
    while len(text) + 40 < budget:
        key = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3))
        if key in keys:
            continue
        value = str(rng.randint(1000, 9999))
        keys.append(key)
        lines.append((key, value))
        text += f"The magic number for {key} is {value}.\n"
    ids = _encode(tokenizer, text + "\n")
    labels = [IGNORE] * len(ids)
    for k, (key, value) in enumerate(rng.sample(lines, min(queries, len(lines)))):
        q_ids, q_labels = _ask(tokenizer, niah_question([key], [value], "numbers", "compact", 0), k == 0)
        ids, labels = ids + q_ids, labels + q_labels
    return Sequence(ids, labels)


def mqar_sequence(tokenizer, rng: random.Random, length: int) -> Sequence:
    """Multi-query associative recall in its plainest form (``key:value`` pairs, then ``key=`` queries), loss on
    the value digits: the recipe that made retrieval emerge within a few hundred steps on this CPU."""
    pairs = max(2, length // 19)
    keys = draw_distinct(rng, "words", "compact", pairs)
    values = [str(rng.randint(1000, 9999)) for _ in keys]
    ids = _encode(tokenizer, " ".join(f"{k}:{v}" for k, v in zip(keys, values)) + "\n")
    labels = [IGNORE] * len(ids)
    for i in rng.sample(range(pairs), pairs):
        prompt, answer = _encode(tokenizer, f" {keys[i]}="), _encode(tokenizer, values[i])
        ids += prompt + answer
        labels += [IGNORE] * len(prompt) + answer
    return Sequence(ids, labels)


def quiz_sequence(tokenizer, rng: random.Random, length: int) -> Sequence:
    """Densest supervision: needles, then a quiz that restates every needle in the same words, loss on the values.

    Each quiz line is exactly the answer prefix of the NIAH questions followed by the value, so what is learnt here
    (find the key, copy what follows it) is what the evaluation asks, one answer per ~40 tokens.
    """
    header = "<|im_start|>user\nRemember the magic numbers.\n\n"
    count = max(2, (length - len(header)) // 76)
    keys = draw_distinct(rng, "words", "compact", count)
    values = [str(rng.randint(1000, 9999)) for _ in keys]
    facts = "".join(f"The magic number for {k} is {v}.\n" for k, v in zip(keys, values))
    ids = _encode(tokenizer, header + facts + "\n")
    labels = [IGNORE] * len(ids)
    for i in rng.sample(range(count), count):
        prompt = _encode(tokenizer, f"The magic number for {keys[i]} is")
        answer = _encode(tokenizer, f" {values[i]}.\n")
        ids += prompt + answer
        labels += [IGNORE] * len(prompt) + answer
    return Sequence(ids, labels)


def _filler(rng: random.Random, kind: str | None, count: int) -> list[str]:
    if kind is None or count == 0:
        return []
    return noise_lines(count) if kind == "noise" else prose_sentences(count, rng)


def needles_sequence(tokenizer, rng: random.Random, length: int) -> Sequence:
    """Every NIAH variant as a dense drill: numbers, uuids or words as values, words or uuids as keys, a quarter of
    the keys holding 2-4 values, needles alone or among filler; then questions in the evaluation's wording about
    one key or 2-4 keys at once, until the row is full. Answers list values in haystack order.
    """
    key_kind = rng.choice(("words", "words", "uuids"))
    value_kind = rng.choice(("numbers", "uuids", "words"))
    filler = rng.choice((None, "noise", "essay"))
    header = f"<|im_start|>user\nRemember the magic {value_kind}.\n\n"
    haystack_chars = int(length * rng.uniform(0.45, 0.7))
    needles: list[tuple[str, str]] = []
    fillers: list[list[str]] = []  # the filler lines before each needle
    used: set[str] = set()
    chars = len(header)
    while chars < haystack_chars:
        key = draw_distinct(rng, key_kind, "compact", 1, used)[0]
        used.add(key)
        for value in draw_distinct(rng, value_kind, "compact", rng.randint(2, 4) if rng.random() < 0.25 else 1, used):
            needles.append((key, value))
            fillers.append(_filler(rng, filler, rng.randint(0, 3)))
            chars += len(needle_text(key, value, value_kind, "compact")) + sum(len(f) + 1 for f in fillers[-1]) + 1
    rng.shuffle(needles)
    lines = [line for (key, value), fill in zip(needles, fillers)
             for line in (*fill, needle_text(key, value, value_kind, "compact"))]
    ids = _encode(tokenizer, header + "\n".join(lines) + "\n\n")
    labels = [IGNORE] * len(ids)
    keys = list(dict.fromkeys(key for key, _ in needles))
    values = {key: [v for k, v in needles if k == key] for key in keys}
    first = True
    while True:
        asked = rng.sample(keys, min(len(keys), rng.randint(2, 4))) if rng.random() < 0.2 else [rng.choice(keys)]
        question = niah_question(asked, [v for key in asked for v in values[key]], value_kind, "compact", 0)
        q_ids, q_labels = _ask(tokenizer, question, first)
        if not first and len(ids) + len(q_ids) > length:
            return Sequence(ids, labels)
        ids, labels, first = ids + q_ids, labels + q_labels, False


def chains_sequence(tokenizer, rng: random.Random, length: int) -> Sequence:
    """Variable tracking as a dense drill: several assignment chains of 2-5 variables hidden among noise lines,
    then one question per chain in the evaluation's wording."""
    chains: list[tuple[str, list[str]]] = []
    names: set[str] = set()
    for _ in range(max(1, length // 512)):
        chain = vt_names(rng, rng.randint(2, 5), "compact", names)
        names.update(chain)
        chains.append((str(rng.randint(10000, 99999)), chain))
    assignments = [vt_chain(chain, value) for value, chain in chains]
    chain_chars = sum(len(line) + 1 for lines_of_chain in assignments for line in lines_of_chain)
    lines = noise_lines(max(1, (length - chain_chars - 70 * len(chains) - 40) // 90))
    # interleave the chains, each keeping its own order, at random depths of the noise
    order = [c for c, lines_of_chain in enumerate(assignments) for _ in lines_of_chain]
    rng.shuffle(order)
    cursor = [0] * len(assignments)
    depths = sorted(rng.randint(0, len(lines)) for _ in order)
    for offset, (depth, c) in enumerate(zip(depths, order)):
        lines.insert(depth + offset, assignments[c][cursor[c]])
        cursor[c] += 1
    ids = _encode(tokenizer, "<|im_start|>user\nTrack the variables.\n\n" + "\n".join(lines) + "\n\n")
    labels = [IGNORE] * len(ids)
    for k, (value, chain) in enumerate(rng.sample(chains, len(chains))):
        q_ids, q_labels = _ask(tokenizer, vt_question(value, chain, "compact", 0), k == 0)
        ids, labels = ids + q_ids, labels + q_labels
    return Sequence(ids, labels)


def text_sequence(tokenizer, rng: random.Random, length: int) -> Sequence:
    """A window of a generic training document, loss on every token."""
    docs = documents(rng.choice(SOURCES), "train")
    _, text = rng.choice(docs)
    start = rng.randrange(max(1, len(text) - length))
    ids = _encode(tokenizer, text[start : start + length])
    return Sequence(ids, list(ids))


def batch(tokenizer, rng: random.Random, size: int, length: int, mix: dict[str, float]) -> tuple[torch.Tensor, ...]:
    """One training batch of rows drawn by ``mix``.

    Parameters
    ----------
    tokenizer : PreTrainedTokenizerFast
    rng : random.Random
        Draws every row (a step's rng makes its batch reproducible).
    size, length : int
        Rows, and tokens per row (padded or truncated to it).
    mix : dict[str, float]
        ``{kind: weight}`` of the row makers (``task``, ``recall``, ``quiz``, ``mqar``, ``needles``, ``chains``,
        ``text``).

    Returns
    -------
    tuple[torch.Tensor, ...]
        Input ids ``[size, length]`` and labels ``[size, length]``: the next-token target of each position,
        :data:`IGNORE` where there is none.
    """
    makers = {"task": task_sequence, "recall": recall_sequence, "quiz": quiz_sequence, "mqar": mqar_sequence,
              "needles": needles_sequence, "chains": chains_sequence, "text": text_sequence}
    pad = tokenizer.pad_token_id
    ids = torch.full((size, length), pad, dtype=torch.long)
    labels = torch.full((size, length), IGNORE, dtype=torch.long)
    kinds, weights = zip(*mix.items())
    for row in range(size):
        kind = rng.choices(kinds, weights)[0]
        seq = makers[kind](tokenizer, rng, length)
        n = min(length, len(seq.ids))
        ids[row, :n] = torch.tensor(seq.ids[:n])
        # label at t is the token at t+1
        shifted = seq.labels[1 : n + 1] + [IGNORE] * (n + 1 - len(seq.labels[: n + 1]))
        labels[row, :n] = torch.tensor(shifted[:n])
    return ids, labels

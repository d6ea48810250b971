"""RULER's 13 synthetic tasks, generated offline by seeded generators of our own.

Structure, counts and metrics follow RULER's ``scripts/data/synthetic`` (NVIDIA/RULER on GitHub).
Two template profiles: ``faithful`` (RULER's wording, 7-digit numbers, uuids, adjective-noun keys) and
``compact`` (the same structure with short keys and values that suit a byte-level model). Every context carries
all its questions; the question text never enters the compressed prefix.
"""

from __future__ import annotations

import random
import string
import uuid
from dataclasses import dataclass
from typing import Callable

from runtime.errors import UsageError

from ..haystacks import check_haystack, sentences
from .items import Item, Question, fit_units
from .text import noise_lines, prose_sentences, word_lists

NIAH = {
    #                  haystack  key      value     k  v  q
    "niah_single_1": ("noise", "words", "numbers", 1, 1, 1),
    "niah_single_2": ("essay", "words", "numbers", 1, 1, 1),
    "niah_single_3": ("essay", "words", "uuids", 1, 1, 1),
    "niah_multikey_1": ("essay", "words", "numbers", 4, 1, 1),
    "niah_multikey_2": ("needle", "words", "numbers", 1, 1, 1),
    "niah_multikey_3": ("needle", "uuids", "uuids", 1, 1, 1),
    "niah_multivalue": ("essay", "words", "numbers", 1, 4, 1),
    "niah_multiquery": ("essay", "words", "numbers", 4, 1, 4),
}
TASKS = (*NIAH, "vt", "cwe", "fwe", "qa_1", "qa_2")
HAYSTACK_TASKS = tuple(task for task, spec in NIAH.items() if spec[0] == "essay")
"""The tasks whose filler is an essay (RULER: Paul Graham's essays): ``--haystack`` chooses its text."""
GENERATED = "generated"
"""The haystack written by this project's seeded generators (:func:`workloads.tasks.text.prose_sentences`)."""
PROFILES = ("faithful", "compact")
MAX_NEW_TOKENS = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50, "qa": 32}
COMPACT_MAX_NEW_TOKENS = {"niah": 24, "vt": 32, "cwe": 96, "fwe": 32, "qa": 24}
METRIC = {**dict.fromkeys((*NIAH, "vt", "cwe", "fwe"), "string_match_all"),
          **dict.fromkeys(("qa_1", "qa_2"), "string_match_part")}
"""Each task's metric (:data:`workloads.metrics.METRICS`), as RULER's ``evaluate.py`` scores it: a function of the
prediction and the references alone."""


def answer_budget(task: str, profile: str) -> int:
    """The tokens every question of ``task`` leaves for its answer in ``profile``: its context is fitted to the length
    less its question and this (:func:`workloads.tasks.items.fit_units`)."""
    return (MAX_NEW_TOKENS if profile == "faithful" else COMPACT_MAX_NEW_TOKENS)[
        "niah" if task in NIAH else task.partition("_")[0]]


@dataclass(frozen=True)
class Config:
    """How items are drawn.

    Attributes
    ----------
    profile : str
        Template profile (:data:`PROFILES`).
    length : int
        Target context length in tokens.
    count_tokens : Callable[[str], int]
        The model's token count of a text.
    essay : str, optional
        A text to draw the essay haystack from instead of the generated prose.
    qa_documents : list[dict], optional
        Documents for the QA tasks instead of the synthetic ones.
    haystack : str
        ``generated``, or a real source of :data:`workloads.corpus.HAYSTACK_SOURCES`.
    """

    profile: str = "compact"
    length: int = 2048
    count_tokens: Callable[[str], int] = len
    essay: str | None = None
    qa_documents: list[dict] | None = None
    haystack: str = GENERATED

    def max_new(self, family: str) -> int:
        return (MAX_NEW_TOKENS if self.profile == "faithful" else COMPACT_MAX_NEW_TOKENS)[family]


# ---- keys and values ----------------------------------------------------------------------------------
def draw_value(rng: random.Random, kind: str, profile: str) -> str:
    """A random key or value of ``kind`` (numbers, uuids or words) in the profile's format."""
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1)) if profile == "faithful" else str(rng.randint(1000, 9999))
    if kind == "uuids":
        text = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        return text if profile == "faithful" else text[:6]
    adjectives, nouns, _ = word_lists()
    if profile == "faithful":
        return f"{rng.choice(adjectives)}-{rng.choice(nouns)}"
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(3))


def draw_distinct(rng: random.Random, kind: str, profile: str, count: int, avoid: set[str] = frozenset()) -> list[str]:
    """``count`` distinct draws of ``kind``, none of them in ``avoid``."""
    out: list[str] = []
    while len(out) < count:
        value = draw_value(rng, kind, profile)
        if value not in out and value not in avoid:
            out.append(value)
    return out


def _type_word(kind: str, singular: bool) -> str:
    word = {"numbers": "numbers", "uuids": "uuids", "words": "words"}[kind]
    return word[:-1] if singular else word


# ---- NIAH ------------------------------------------------------------------------------------------
def needle_text(key: str, value: str, value_kind: str, profile: str) -> str:
    """One needle sentence in the profile's wording."""
    if profile == "faithful":
        return f"One of the special magic {_type_word(value_kind, False)} for {key} is: {value}."
    return f"The magic {_type_word(value_kind, True)} for {key} is {value}."


def niah_question(keys: list[str], answers: list[str], value_kind: str, profile: str, max_new: int,
                  needles: list[str] = ()) -> Question:
    """The question asking for every value of ``keys`` (one key, several values, or several keys at once);
    ``needles``: the needle sentences that carry its answers."""
    query = keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + ", and " + keys[-1]
    one = len(answers) == 1
    tv = _type_word(value_kind, one)
    if profile == "faithful":
        verb = "is" if one else "are"
        text = (f"What {'is the' if one else 'are all the'} special magic {tv} for {query} "
                "mentioned in the provided text?")
        prefix = f" The special magic {tv} for {query} mentioned in the provided text {verb}"
    else:
        text = f"What {'is the' if one else 'are the'} magic {tv} for {query}?"
        prefix = f" The magic {tv} for {query} {'is' if one else 'are'}"
    return Question(text, prefix, answers, max_new, needles=list(needles))


def _niah(task: str, rng: random.Random, cfg: Config) -> Item:
    haystack, key_kind, value_kind, num_k, num_v, num_q = NIAH[task]
    num_k = max(num_k, num_q)
    keys = draw_distinct(rng, key_kind, cfg.profile, num_k)
    values = [draw_distinct(rng, value_kind, cfg.profile, num_v) for _ in keys]
    queried = rng.sample(range(num_k), num_q)

    def needle(key: str, value: str) -> str:
        return needle_text(key, value, value_kind, cfg.profile)

    needles = [needle(k, v) for k, vs in zip(keys, values) for v in vs]
    rng.shuffle(needles)
    header = (f"Some special magic {_type_word(value_kind, False)} are hidden within the following text. "
              f"Make sure to memorize it. I will quiz you about the {_type_word(value_kind, False)} afterwards."
              if cfg.profile == "faithful" else f"Remember the magic {_type_word(value_kind, False)}.")

    def question(idx: list[int]) -> Question:
        return niah_question([keys[i] for i in idx], [v for i in idx for v in values[i]], value_kind, cfg.profile,
                             cfg.max_new("niah"), [needle(keys[i], v) for i in idx for v in values[i]])

    # multi-key tasks ask about each needle key in turn (each a valid single question of the task), so that one
    # compacted child answers several; multi-query asks its four keys together, as RULER does
    groups = [queried] if num_q > 1 else [[i] for i in range(num_k)] if task == "niah_multikey_1" else [queried]
    questions = [question(g) for g in groups]

    layout_seed = rng.random()

    real = haystack == "essay" and cfg.haystack != GENERATED

    def render(units: int) -> str:
        local = random.Random(layout_seed)
        if haystack == "noise":
            lines = noise_lines(units)
        elif real:
            lines = sentences(cfg.haystack, units, local)
        elif haystack == "essay":
            lines = prose_sentences(units, local, cfg.essay)
        else:
            avoid = set(keys)
            lines = [needle(k, draw_value(local, value_kind, cfg.profile))
                     for k in draw_distinct(local, key_kind, cfg.profile, units, avoid)]
        depths = sorted(local.randint(0, len(lines)) for _ in needles)
        for offset, (depth, text) in enumerate(zip(depths, needles)):
            lines.insert(depth + offset, text)
        # real text is running prose with the needles between its sentences, as RULER builds its essay haystack;
        # the generated fillers keep one sentence per line
        return (" " if real else "\n").join(lines)

    body = fit_units(render, header, questions, cfg)
    return Item(task, header, body, questions, METRIC[task],
                haystack=cfg.haystack if haystack == "essay" else GENERATED)


# ---- variable tracking -------------------------------------------------------------------------------
def vt_chain(names: list[str], value: str) -> list[str]:
    """The assignment lines of one chain: the first name gets the value, each next one the previous name."""
    return [f"VAR {names[0]} = {value}"] + [f"VAR {b} = VAR {a}" for a, b in zip(names, names[1:])]


def vt_question(value: str, names: list[str], profile: str, max_new: int) -> Question:
    """The question asking for every variable of the chain that carries ``value``."""
    if profile == "faithful":
        text = f"Question: Find all variables that are assigned the value {value} in the text above."
        prefix = (f" Answer: According to the chain(s) of variable assignment in the text above, {len(names)} "
                  f"variables are assigned the value {value}, they are:")
    else:
        text, prefix = f"Which variables equal {value}?", " They are:"
    return Question(text, prefix, names, max_new)


def vt_names(rng: random.Random, count: int, profile: str, avoid: set[str] = frozenset()) -> list[str]:
    """``count`` distinct upper-case variable names (5 letters in the faithful profile, 3 in compact)."""
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choice(string.ascii_uppercase) for _ in range(5 if profile == "faithful" else 3))
        if name not in names and name not in avoid:
            names.append(name)
    return names


def _vt(rng: random.Random, cfg: Config) -> Item:
    faithful = cfg.profile == "faithful"
    names = vt_names(rng, 5, cfg.profile)
    value = str(rng.randint(10000, 99999))
    chain = vt_chain(names, value)
    header = ("Memorize and track the chain(s) of variable assignment hidden in the following text."
              if faithful else "Track the variables.")
    questions = [vt_question(value, names, cfg.profile, cfg.max_new("vt"))]

    layout_seed = rng.random()

    def render(units: int) -> str:
        local = random.Random(layout_seed)
        lines = noise_lines(units)
        depths = sorted(local.randint(0, len(lines)) for _ in chain)
        for offset, (depth, line) in enumerate(zip(depths, chain)):
            lines.insert(depth + offset, line)
        return "\n".join(lines)

    return Item("vt", header, fit_units(render, header, questions, cfg), questions, METRIC["vt"])


# ---- common and frequent words -------------------------------------------------------------------------
def _cwe(rng: random.Random, cfg: Config) -> Item:
    _, nouns, verbs = word_lists()
    pool = [w for w in nouns + verbs if w.isalpha() and (cfg.profile == "faithful" or len(w) <= 6)]
    common = rng.sample(pool, 10)
    rest_pool = [w for w in pool if w not in common]
    many, few = (30, 3) if cfg.length >= 4096 else (6, 1)
    header = ("Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
              "ones that appear most often." if cfg.profile == "faithful" else "Count the words.")
    text = ("Question: What are the 10 most common words in the above list?" if cfg.profile == "faithful"
            else "Which 10 words are most common?")
    prefix = " Answer: The top 10 words that appear most often in the list are:"
    questions = [Question(text, prefix, common, cfg.max_new("cwe"))]

    layout_seed = rng.random()

    def render(units: int) -> str:
        local = random.Random(layout_seed)
        words = common * many + local.sample(rest_pool, min(units, len(rest_pool))) * few
        local.shuffle(words)
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))

    return Item("cwe", header, fit_units(render, header, questions, cfg), questions, METRIC["cwe"])


def _fwe(rng: random.Random, cfg: Config) -> Item:
    alpha = 2.0
    letters = 6 if cfg.profile == "faithful" else 4
    vocab_size = max(8, (cfg.length - 50) // 50)
    vocab: list[str] = []
    while len(vocab) < vocab_size:
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(letters))
        if word not in vocab:
            vocab.append(word)
    vocab[0] = "...."
    zeta = sum(k**-alpha for k in range(1, 10000))
    header = ("Read the following coded text and track the frequency of each coded word. Find the three most "
              "frequently appeared coded words." if cfg.profile == "faithful"
              else "Find the three most frequent words.")
    text = ("Question: Do not provide any explanation. Please ignore the dots '....'. What are the three most "
            "frequently appeared words in the above coded text?" if cfg.profile == "faithful"
            else "Ignoring '....', which three words are most frequent?")
    prefix = " Answer: According to the coded text above, the three most frequently appeared words are:"
    questions = [Question(text, prefix, vocab[1:4], cfg.max_new("fwe"))]

    layout_seed = rng.random()

    def render(units: int) -> str:
        local = random.Random(layout_seed)
        words = [w for k, w in enumerate(vocab, 1) for _ in range(max(1, int(units * k**-alpha / zeta)))]
        local.shuffle(words)
        return " ".join(words)

    return Item("fwe", header, fit_units(render, header, questions, cfg, grow=lambda u: u + max(8, u // 8)),
                questions, METRIC["fwe"])


# ---- question answering ---------------------------------------------------------------------------------
def _qa(task: str, rng: random.Random, cfg: Config) -> Item:
    from .qa import synthetic_qa, user_qa

    hops = 1 if task == "qa_1" else 2
    gold, question_text, answers, distract = (
        user_qa(rng, cfg.qa_documents, hops) if cfg.qa_documents else synthetic_qa(rng, hops, cfg.profile)
    )
    header = ("Answer the question based on the given documents. Only give me the answer and do not output any "
              "other words.\n\nThe following are given documents." if cfg.profile == "faithful"
              else "Read the documents.")
    text = ("Answer the question based on the given documents. Only give me the answer and do not output any other "
            f"words.\n\nQuestion: {question_text}" if cfg.profile == "faithful" else f"Question: {question_text}")
    questions = [Question(text, " Answer:", answers, cfg.max_new("qa"))]

    layout_seed = rng.random()

    def render(units: int) -> str:
        local = random.Random(layout_seed)
        docs = gold + [distract(local) for _ in range(units)]
        random.Random(len(docs)).shuffle(docs)  # RULER re-seeds its shuffle by list length
        return "\n\n".join(f"Document {i + 1}:\n{d}" for i, d in enumerate(docs))

    return Item(task, header, fit_units(render, header, questions, cfg), questions, METRIC[task])


def generate(task: str, index: int, seed: int = 0, config: Config = Config()) -> Item:
    """Item ``index`` of ``task``: deterministic in (task, index, seed, profile, length)."""
    if task not in TASKS:
        raise UsageError(f"unknown RULER task {task!r}; choose from {', '.join(TASKS)}")
    if config.profile not in PROFILES:
        raise UsageError(f"unknown template profile {config.profile!r}; choose from {', '.join(PROFILES)}")
    if config.haystack != GENERATED:
        check_haystack(config.haystack)
    rng = random.Random(f"{task}/{seed}/{index}/{config.profile}/{config.length}")
    if task in NIAH:
        item = _niah(task, rng, config)
    elif task == "vt":
        item = _vt(rng, config)
    elif task == "cwe":
        item = _cwe(rng, config)
    elif task == "fwe":
        item = _fwe(rng, config)
    else:
        item = _qa(task, rng, config)
    item.index, item.seed = index, seed
    return item

"""The text a distillation run trains and is measured on (:mod:`hybridmodel.distill`), window by window: plain
windows of the training sources' documents (:class:`Windows`), copy windows in which a span recurs
(:class:`CopyWindows`), the teacher's own ChatML conversations (:class:`TeacherSamples`); the kind and the length of the
window of a phase's step (:func:`window_kind`, :func:`window_length`), and the seeds a phase reads them with. A window
depends on its seed and step only, so a resumed run reads what an unbroken one would. Recall windows are
:mod:`hybridmodel.recall_windows`'s.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch

from runtime.errors import UsageError
from workloads.corpus import SOURCES, documents

from .distill_config import DistillConfig
from .recall_windows import vocabulary


def _token_documents(tokenizer, split: str) -> list[list[int]]:
    return [tokenizer(text, add_special_tokens=False)["input_ids"]
            for source in SOURCES for _, text in documents(source, split)]


class Windows:
    """Windows of ``length`` tokens from the documents of one split (``split``; ``docs`` their token ids), packed
    with ``separator`` between documents; the window of step ``k`` depends on ``(seed, k)`` only, so a resumed run
    reads what an unbroken one would."""

    def __init__(self, tokenizer, split: str, length: int, seed: int):
        self.docs = [doc for doc in _token_documents(tokenizer, split) if len(doc) >= 64]
        if not self.docs:
            raise UsageError(f"no documents of {', '.join(SOURCES)} ({split} split) on this machine")
        self.split, self.length, self.seed, self.separator = split, length, seed, tokenizer.eos_token_id

    def __call__(self, step: int) -> torch.Tensor:
        rng = random.Random(self.seed * 1_000_003 + step)
        doc = rng.choice(self.docs)
        start = rng.randrange(max(1, len(doc) - self.length))
        ids = doc[start:start + self.length]
        while len(ids) < self.length:
            ids = ids + [self.separator] + rng.choice(self.docs)
        return torch.tensor(ids[:self.length]).unsqueeze(0)


class CopyWindows:
    """Windows of ``length`` tokens in which a span recurs: ``[text] sep [A] sep [text] sep [A] sep [text]``, ``A`` a
    span of ``span`` tokens (drawn in ``[span_min, span_max]``) of one document, the texts packed from the others,
    the distance between the two copies and the place of the first drawn too; everything from the documents of one
    split of the training sources, and deterministic in ``(seed, step)``.

    Calling returns ``(ids [1, length], first, repeat)``, ``first`` and ``repeat`` the ``(start, end)`` positions of
    the two copies of ``A`` (``ids[0, start:end]`` equal)."""

    def __init__(self, tokenizer, split: str, length: int, seed: int, span_min: int = 32, span_max: int = 256):
        self.plain = Windows(tokenizer, split, length, seed)
        self.length, self.seed, self.separator = length, seed, tokenizer.eos_token_id
        self.span_max = max(2, min(span_max, (length - 4) // 4))
        self.span_min = max(2, min(span_min, self.span_max))

    def _text(self, rng: random.Random, count: int) -> list[int]:
        ids: list[int] = []
        while len(ids) < count:
            doc = rng.choice(self.plain.docs)
            start = rng.randrange(max(1, len(doc) - count))
            ids = ids + ([self.separator] if ids else []) + doc[start:start + count - len(ids)]
        return ids[:count]

    def __call__(self, step: int) -> tuple[torch.Tensor, tuple[int, int], tuple[int, int]]:
        rng = random.Random(f"copy:{self.seed}:{step}")
        span = rng.randint(self.span_min, self.span_max)
        doc = rng.choice([d for d in self.plain.docs if len(d) >= span] or self.plain.docs)
        offset = rng.randrange(max(1, len(doc) - span + 1))
        piece = doc[offset:offset + span]
        span = len(piece)
        rest = self.length - 2 * span - 4
        gap = rng.randint(0, rest)  # the text between the copies: their distance
        before = rng.randint(0, rest - gap)
        text = self._text(rng, rest)
        sep = [self.separator]
        ids = (text[:before] + sep + piece + sep + text[before:before + gap] + sep + piece + sep
               + text[before + gap:])
        first = (before + 1, before + 1 + span)
        repeat = (first[1] + 1 + gap + 1, first[1] + 1 + gap + 1 + span)
        return torch.tensor(ids).unsqueeze(0), first, repeat


CHAT_INSTRUCTIONS = ("Summarise this text in two or three sentences.", "Explain what this does.",
                     "What does this code or text do?", "Continue this text.", "What is this about?")
"""The user turns of the teacher samples: one of these over a training-source snippet."""

GENERAL_INSTRUCTIONS = ("In two sentences, what is meant by {topic}?",
                        "Describe {topic} to someone who has never heard of it.",
                        "Give a short, friendly explanation of {topic}.",
                        "Why would a person care about {topic}? Keep it brief.",
                        "Suggest one practical tip that involves {topic}.",
                        "Write a polite two-line message to a colleague that mentions {topic}.",
                        "What do people often get wrong about {topic}?",
                        "Compare {topic} and {other} in a few words.")
"""User turns of the teacher samples that carry no snippet (``general_fraction``): a question about a word of the
training documents, so that the hybrid learns how the teacher answers a plain request — briefly, and without
repeating itself — as well as how it treats a quoted text. Their wording shares no four words with the benchmark
tasks nor with the chat check's questions (tests/model/test_distill.py)."""


class TeacherSamples:
    """The teacher's own ChatML conversations: conversation ``i`` is a user turn (one of :data:`CHAT_INSTRUCTIONS`
    over a snippet of 48-200 tokens of a training-split document, both drawn from ``(seed, i)``; or, with
    probability ``general_fraction`` drawn apart from ``(seed, i)``, one of :data:`GENERAL_INSTRUCTIONS` about
    words of the training documents) and the teacher's answer, sampled (temperature 0.7, top-p 0.9, torch seeded
    from ``(seed, i)``) up to ``max_new_tokens``.

    A conversation is generated the first time a window needs it and appended to ``cache`` (JSON lines), which a
    resumed run reads back; lines of another seed, answer length or teacher are ignored. Calling with a step packs
    conversations drawn from ``(seed, step)`` into a window of ``length`` tokens. ``seconds`` is the generation
    time spent so far (cached lines included)."""

    def __init__(self, teacher, tokenizer, split: str, seed: int, pool: int, max_new_tokens: int, length: int,
                 cache: Path | None = None, general_fraction: float = 0.0):
        self.teacher, self.tokenizer, self.seed, self.pool = teacher, tokenizer, seed, pool
        self.max_new_tokens, self.length, self.cache = max_new_tokens, length, cache
        self.docs = Windows(tokenizer, split, 64, seed).docs
        self.general_fraction = general_fraction
        self.topics = vocabulary(self.docs, tokenizer) if general_fraction else []
        c = teacher.config
        self.key = {"seed": seed, "max_new_tokens": max_new_tokens,
                    "teacher": [c.model_type, c.vocab_size, c.hidden_size, c.num_hidden_layers]}
        if general_fraction:  # a pool without general turns keeps the key its cached conversations were written with
            self.key["general_fraction"] = general_fraction
        self.samples: dict[int, dict] = {}
        if cache is not None and Path(cache).exists():
            for line in Path(cache).read_text().splitlines():
                if line.strip():
                    sample = json.loads(line)
                    if sample.get("key") == self.key:
                        self.samples[sample["index"]] = sample

    @property
    def seconds(self) -> float:
        return sum(sample["seconds"] for sample in self.samples.values())

    def message(self, index: int) -> str:
        """The user turn of conversation ``index``."""
        general = random.Random(f"chat-general:{self.seed}:{index}")
        if general.random() < self.general_fraction:
            topic, other = general.sample(self.topics, 2)
            return general.choice(GENERAL_INSTRUCTIONS).format(topic=topic, other=other)
        rng = random.Random(f"chat:{self.seed}:{index}")
        doc = rng.choice(self.docs)
        count = rng.randint(48, 200)
        start = rng.randrange(max(1, len(doc) - count))
        snippet = self.tokenizer.decode(doc[start:start + count]).strip()
        return f"{rng.choice(CHAT_INSTRUCTIONS)}\n\n{snippet}"

    def prompt(self, index: int) -> list[int]:
        message = self.message(index)
        ids = self.tokenizer.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True,
                                                 tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)

    @torch.no_grad()
    def conversation(self, index: int) -> list[int]:
        if index not in self.samples:
            tick = time.monotonic()
            prompt = torch.tensor(self.prompt(index)).unsqueeze(0)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed * 1_000_003 + index)
                out = self.teacher.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True,
                                            temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=self.max_new_tokens,
                                            eos_token_id=self.tokenizer.eos_token_id,
                                            pad_token_id=self.tokenizer.eos_token_id)
            sample = {"index": index, "key": self.key, "ids": out[0].tolist(),
                      "answer_tokens": out.shape[1] - prompt.shape[1], "seconds": round(time.monotonic() - tick, 2)}
            self.samples[index] = sample
            if self.cache is not None:
                with open(self.cache, "a") as file:
                    file.write(json.dumps(sample) + "\n")
        return self.samples[index]["ids"]

    def __call__(self, step: int) -> torch.Tensor:
        rng = random.Random(f"chat-window:{self.seed}:{step}")
        ids: list[int] = []
        while len(ids) < self.length:
            ids = ids + self.conversation(rng.randrange(self.pool))
        return torch.tensor(ids[:self.length]).unsqueeze(0)


def window_kind(cfg: DistillConfig, step: int) -> str:
    """``plain``, ``copy``, ``chat`` or ``recall``: the kind of the window of ``step`` (of the phase), from ``(seed,
    phase, step)`` and the config's shares (phase 1's defaults: always ``plain``)."""
    if not cfg.copy_fraction and not cfg.chat_fraction and not cfg.recall_fraction:
        return "plain"
    draw = random.Random(f"kind:{cfg.seed}:{cfg.phase}:{step}").random()
    for kind, share in (("copy", cfg.copy_fraction), ("chat", cfg.chat_fraction), ("recall", cfg.recall_fraction)):
        if draw < share:
            return kind
        draw -= share
    return "plain"


def window_length(cfg: DistillConfig, step: int) -> int:
    """Tokens of the window of ``step``: one of ``recall_lengths`` for a recall window (from ``(seed, phase,
    step)``), ``length`` otherwise."""
    if window_kind(cfg, step) != "recall" or not cfg.recall_lengths:
        return cfg.length
    return random.Random(f"recall-length:{cfg.seed}:{cfg.phase}:{step}").choice(cfg.recall_lengths)


def tokens_before(cfg: DistillConfig, step: int) -> int:
    """Tokens of the phase's windows before ``step``."""
    if not cfg.recall_fraction:
        return step * cfg.length
    return sum(window_length(cfg, k) for k in range(step))


def data_seed(cfg: DistillConfig) -> int:
    """The seed of a phase's training windows: phase 1 reads what it always read; each later phase reads other
    windows."""
    return cfg.seed + 1000 * (cfg.phase - 1)


def shared_seed(cfg: DistillConfig) -> int:
    """The seed of the held-out windows, the probe and the teacher's pool: phase 1's own; phase 2's for every later
    phase, so that later phases are measured on one yardstick and the pool (≈ 40 min of the teacher's generation)
    is generated once."""
    return cfg.seed if cfg.phase == 1 else cfg.seed + 1000

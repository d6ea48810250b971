"""Offline generated haystack text: RULER's noise sentence, seeded prose of our own and word lists from wonderwords
(real text is :mod:`workloads.haystacks`'s)."""

from __future__ import annotations

import importlib.resources
import random
import re
from functools import lru_cache

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


@lru_cache(maxsize=1)
def word_lists() -> tuple[list[str], list[str], list[str]]:
    """(adjectives, nouns, verbs) shipped with the ``wonderwords`` package (as RULER uses them)."""
    assets = importlib.resources.files("wonderwords.assets")
    read = lambda name: [w for w in assets.joinpath(name).read_text().split() if w.isascii()]  # noqa: E731
    return read("adjectivelist.txt"), read("nounlist.txt"), read("verblist.txt")


def noise_lines(count: int) -> list[str]:
    return [NOISE] * count


_TEMPLATES = (
    "The {adj} {noun} {verb}s near the {noun2}.",
    "Every {noun} needs a {adj} {noun2} before it can {verb}.",
    "When the {noun} began to {verb}, the {adj} {noun2} stayed calm.",
    "Nobody expected the {noun2} to {verb} so early.",
    "A {adj} idea is worth more than a {noun}.",
    "We learned that the {noun} and the {noun2} {verb} together.",
    "It is hard to {verb} a {adj} {noun} without help.",
    "Later that year, the {noun} was {adj} again.",
)


def prose_sentences(count: int, rng: random.Random, essay: str | None = None) -> list[str]:
    """``count`` essay-like sentences: from the user's essay text when given (cycled), else seeded prose."""
    if essay:
        sentences = [s for s in re.split(r"(?<=[.!?])\s+", essay.strip()) if s]
        start = rng.randrange(len(sentences))
        return [sentences[(start + i) % len(sentences)] for i in range(count)]
    adjectives, nouns, verbs = word_lists()
    short = lambda words: [w for w in words if w.isalpha() and len(w) <= 8]  # noqa: E731
    adjectives, nouns, verbs = short(adjectives), short(nouns), short(verbs)
    return [
        rng.choice(_TEMPLATES).format(
            adj=rng.choice(adjectives), noun=rng.choice(nouns), noun2=rng.choice(nouns), verb=rng.choice(verbs)
        )
        for _ in range(count)
    ]

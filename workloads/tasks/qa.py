"""Question-answering documents for qa_1 (single hop) and qa_2 (two hops).

With local SQuAD / HotpotQA rows (``{"context", "question", "answers"}``, HotpotQA rows with a list of
``contexts``) the gold documents are theirs; otherwise seeded synthetic fact documents stand in.
"""

from __future__ import annotations

import random

from .text import word_lists

_CITIES = ("Avalon", "Brindle", "Corvo", "Dunmore", "Elkhart", "Fairhope", "Galen", "Harlow", "Ives", "Jasper",
           "Kestrel", "Lorne", "Marrow", "Norwick", "Oakum", "Pell", "Quarry", "Rook", "Selby", "Tamsin")


def _person(rng: random.Random, profile: str) -> str:
    _, nouns, _ = word_lists()
    name = rng.choice([n for n in nouns if n.isalpha() and 4 <= len(n) <= 7]).capitalize()
    return name if profile == "compact" else f"{name} {rng.choice(_CITIES)}son"


def _fact(rng: random.Random, profile: str) -> str:
    return f"{_person(rng, profile)} lives in {rng.choice(_CITIES)}."


def synthetic_qa(rng: random.Random, hops: int, profile: str):
    """Gold documents, question, references and a distractor factory for a synthetic fact QA item."""
    person, city = _person(rng, profile), rng.choice(_CITIES)
    distract = lambda local: _fact(local, profile)  # noqa: E731
    if hops == 1:
        return [f"{person} lives in {city}."], f"Where does {person} live?", [city], distract
    friend = _person(rng, profile)
    while friend == person:
        friend = _person(rng, profile)
    gold = [f"{person} works with {friend}.", f"{friend} lives in {city}."]
    return gold, f"Where does the colleague of {person} live?", [city], distract


def user_qa(rng: random.Random, rows: list[dict], hops: int):
    """Gold documents from a local SQuAD (hops=1) or HotpotQA (hops=2) row; other rows' documents distract."""
    row = rng.choice(rows)
    gold = list(row["contexts"]) if "contexts" in row else [row["context"]]
    others = [r for r in rows if r is not row]

    def distract(local: random.Random) -> str:
        other = local.choice(others)
        return local.choice(other["contexts"]) if "contexts" in other else other["context"]

    return gold, row["question"], list(row["answers"]), distract

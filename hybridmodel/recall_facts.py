"""What a recall window (:mod:`hybridmodel.recall_windows`) says: its facts, in ten formats (:data:`FORMATS`), each
with keys and values drawn at random (invented names, codes, dates, versions, and words of the training text:
:func:`vocabulary`) and several phrasings of the fact, of the question about it and of the reply; and the openings
and leads around the questions. The wording is its own: ``tests/model/test_recall_windows.py`` checks it against every
template of the benchmark tasks of :mod:`workloads.tasks`.
"""

from __future__ import annotations

import random
import re
import string
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from runtime.errors import UsageError


@dataclass(frozen=True)
class Fact:
    """One fact set in a window.

    Attributes
    ----------
    kind : str
        Its format (a key of :data:`FORMATS`).
    key : str
        What a question about it names (unique in its window).
    value : str
        What the reply states.
    text : str
        The line inserted into the text.
    """

    kind: str
    key: str
    value: str
    text: str


# ---- invented keys and values ----------------------------------------------------------------------------
_ONSETS = ("b", "br", "c", "ch", "d", "dr", "f", "g", "gr", "h", "j", "k", "l", "m", "n", "p", "pr", "r", "s", "sh",
           "st", "t", "th", "tr", "v", "w", "z")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "io", "ou")
_CODAS = ("", "", "n", "l", "r", "s", "th", "m", "x", "nd", "rk", "st")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")
_STREETS = ("Street", "Road", "Lane", "Avenue", "Way", "Close", "Terrace", "Drive")
_ROLES = ("treasurer", "release manager", "head of testing", "chief editor", "safety officer", "archivist",
          "on-call engineer", "budget owner", "deputy chair", "lead designer")
_GROUPS = ("team", "committee", "working group", "office", "lab", "guild")
_EVENTS = ("review", "audit", "workshop", "launch", "deadline", "offsite", "retrospective", "migration")
_PRODUCTS = ("filter", "adapter", "bracket", "lamp", "valve", "charger", "sensor", "kettle")
_SERVICES = ("service", "account", "cluster", "mailbox", "project", "bucket")
_BANNED = {"magic", "needle", "needles", "haystack", "passkey", "special", "memorize", "quiz"}
"""Words that name the benchmark's own tasks: never drawn from the training text into a key or a value."""


def _syllables(rng: random.Random, count: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(count - 1)) + \
        rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)


def _name(rng: random.Random) -> str:
    return f"{_syllables(rng, rng.randint(2, 3)).capitalize()} {_syllables(rng, rng.randint(2, 3)).capitalize()}"


def _code(rng: random.Random) -> str:
    letters = "".join(rng.choice(string.ascii_uppercase) for _ in range(rng.randint(2, 3)))
    digits = str(rng.randint(100, 99999))
    return rng.choice((f"{letters}-{digits}", f"{letters}{digits}", f"{letters}-{digits}-{rng.choice('ABCDEFGH')}"))


def _number(rng: random.Random) -> str:
    return str(rng.choice((rng.randint(2, 99), rng.randint(100, 9999), rng.randint(10000, 999999))))


def _date(rng: random.Random) -> str:
    year, month, day = rng.randint(1990, 2045), rng.randint(1, 12), rng.randint(1, 28)
    return rng.choice((f"{_MONTHS[month - 1]} {day}, {year}", f"{day} {_MONTHS[month - 1]} {year}",
                       f"{year}-{month:02d}-{day:02d}"))


def _version(rng: random.Random) -> str:
    parts = [str(rng.randint(0, 12)), str(rng.randint(0, 30))] + ([str(rng.randint(0, 40))] if rng.random() < 0.7
                                                                  else [])
    return ("v" if rng.random() < 0.3 else "") + ".".join(parts)


# ---- the formats: how a key and a value are drawn, and every phrasing of fact, question and reply ---------
@dataclass(frozen=True)
class Format:
    """One kind of fact.

    Attributes
    ----------
    key, value : Callable[[random.Random, list[str]], str]
        Draw a key and a value from ``(rng, vocabulary)``.
    facts, questions, replies : tuple[str, ...]
        Phrasings with ``{k}`` (the key) and ``{v}`` (the value); a question names ``{k}`` only; a reply states
        ``{v}`` once, at its start or after a space.
    """

    key: Callable[[random.Random, list[str]], str]
    value: Callable[[random.Random, list[str]], str]
    facts: tuple[str, ...]
    questions: tuple[str, ...]
    replies: tuple[str, ...]


def _words(rng: random.Random, vocabulary: list[str], count: int) -> list[str]:
    return rng.sample(vocabulary, count)


FORMATS: dict[str, Format] = {
    "setting": Format(
        key=lambda rng, vocab: rng.choice(("_", ".", "_")).join(_words(rng, vocab, rng.randint(2, 3))),
        value=lambda rng, vocab: rng.choice((_number(rng), _number(rng), rng.choice(vocab), f"{rng.randint(1, 90)}s")),
        facts=("{k} = {v}", "{k}: {v}", "In the configuration file, {k} is set to {v}.",
               "Setting {k} was changed to {v} last week.", "[settings] {k}={v}",
               "The default for {k} has been {v} since the last release."),
        questions=("What is {k} set to?", "Which value does the configuration give {k}?", "What did we set {k} to?",
                   "Tell me the current value of {k}."),
        replies=("{v}", "{k} is set to {v}.", "It is {v}.", "The configuration has {k} = {v}.")),
    "definition": Format(
        key=lambda rng, vocab: _syllables(rng, 3),
        value=lambda rng, vocab: rng.choice(("a", "the", "any")) + " " + " ".join(_words(rng, vocab,
                                                                                       rng.randint(2, 3))),
        facts=("{k} (noun): {v}.", "In this text, {k} means {v}.", "The word {k} refers to {v}.",
               "By {k} we mean {v}.", "Glossary entry, {k}: {v}."),
        questions=("What does {k} mean?", "Define {k}.", "What is meant by {k} here?",
                   "How was the term {k} defined?"),
        replies=("{v}", "{k} means {v}.", "It refers to {v}.", "The word stands for {v}.")),
    "identifier": Format(
        key=lambda rng, vocab: " ".join(_words(rng, vocab, 2)) + " " + rng.choice(_SERVICES),
        value=lambda rng, vocab: rng.choice((_code(rng).lower(), f"id-{rng.getrandbits(24):06x}",
                                            str(rng.randint(10000, 9999999)))),
        facts=("The {k} has the identifier {v}.", "Identifier of the {k}: {v}", "{v} is the ID assigned to the {k}.",
               "Record for the {k} (ID {v})."),
        questions=("What is the ID of the {k}?", "Which identifier belongs to the {k}?",
                   "Give the identifier assigned to the {k}."),
        replies=("{v}", "The {k} has ID {v}.", "Its identifier is {v}.")),
    "address": Format(
        key=lambda rng, vocab: _name(rng),
        value=lambda rng, vocab: (f"{rng.randint(1, 480)} {_syllables(rng, 2).capitalize()} {rng.choice(_STREETS)}, "
                                  f"{_syllables(rng, 3).capitalize()} {rng.randint(10000, 99999)}"),
        facts=("{k}'s mailing address is {v}.", "Letters for {k} go to {v}.", "Address on file for {k}: {v}",
               "{k} moved to {v} in the spring."),
        questions=("What is {k}'s mailing address?", "Where should letters for {k} be sent?",
                   "Which address do we have on file for {k}?"),
        replies=("{v}", "{k}'s address is {v}.", "Send them to {v}.")),
    "date": Format(
        key=lambda rng, vocab: " ".join(_words(rng, vocab, 2)) + " " + rng.choice(_EVENTS),
        value=lambda rng, vocab: _date(rng),
        facts=("The {k} is scheduled for {v}.", "{v}: {k}", "We held the {k} on {v}.",
               "Mark your calendar: the {k} falls on {v}."),
        questions=("When is the {k}?", "On what date is the {k}?", "Which day was chosen for the {k}?"),
        replies=("{v}", "The {k} is on {v}.", "It falls on {v}.")),
    "role": Format(
        key=lambda rng, vocab: f"{rng.choice(_ROLES)} of the {rng.choice(vocab)} {rng.choice(_GROUPS)}",
        value=lambda rng, vocab: _name(rng),
        facts=("{v} serves as {k}.", "The {k} is {v}.", "{k}: {v}", "Ask {v}, our {k}, about it."),
        questions=("Who is the {k}?", "Which person serves as {k}?", "Who was named {k}?"),
        replies=("{v}", "{v} is the {k}.", "That would be {v}.")),
    "product": Format(
        key=lambda rng, vocab: f"{_syllables(rng, 2).capitalize()} {rng.choice(vocab)} {rng.choice(_PRODUCTS)}",
        value=lambda rng, vocab: _code(rng),
        facts=("The {k} ships under product code {v}.", "SKU {v}: {k}", "Order the {k} by its catalogue number, {v}.",
               "Product code for the {k}: {v}"),
        questions=("What is the product code of the {k}?", "Which catalogue number does the {k} have?",
                   "What SKU should I order for the {k}?"),
        replies=("{v}", "The {k} is {v}.", "Its code is {v}.")),
    "extension": Format(
        key=lambda rng, vocab: _name(rng),
        value=lambda rng, vocab: str(rng.randint(100, 99999)),
        facts=("You can reach {k} at extension {v}.", "{k}, ext. {v}", "Phone list: {k} on {v}.",
               "For anything urgent call {k} on extension {v}."),
        questions=("What is {k}'s phone extension?", "Which extension reaches {k}?", "How do I call {k}?"),
        replies=("{v}", "Extension {v}.", "Dial {v}.")),
    "version": Format(
        key=lambda rng, vocab: rng.choice(("-".join(_words(rng, vocab, 2)),
                                           _syllables(rng, 2) + rng.choice(("", "lib", "kit", "py", "-core")))),
        value=lambda rng, vocab: _version(rng),
        facts=("We pinned {k} to version {v}.", "{k}=={v}", "The build uses {k} {v}.",
               "Upgrade note: {k} is now at {v}."),
        questions=("Which version of {k} do we use?", "What version is {k} pinned to?",
                   "What release of {k} does the build use?"),
        replies=("{v}", "Version {v}.", "We use {k} {v}.")),
    "room": Format(
        key=lambda rng, vocab: " ".join(_words(rng, vocab, 2)) + " " + rng.choice(_EVENTS + _GROUPS),
        value=lambda rng, vocab: rng.choice((f"{rng.choice('ABCDEFGH')}-{rng.randint(100, 699)}",
                                            f"{rng.randint(1, 9)}.{rng.randint(1, 40):02d}",
                                            f"{_syllables(rng, 2).capitalize()} Hall")),
        facts=("The {k} meets in room {v}.", "Room for the {k}: {v}", "Please note the {k} moved to room {v}.",
               "Room {v} is booked for the {k}."),
        questions=("Where does the {k} meet?", "Which room is the {k} in?", "What room was booked for the {k}?"),
        replies=("{v}", "Room {v}.", "The {k} meets in {v}.")),
}
"""Every format a fact takes."""

OPENINGS = ("Please read the following material.", "Below is an excerpt; some questions about it come afterwards.",
            "Keep the details of this text in mind.", "Read this carefully:",
            "I am going to share a document with you.", "Here is some reference material for our conversation.")
"""What the user's turn may open with before the text."""
LEADS = ("", "", "Quick question. ", "One thing I need to check. ", "Back to the text for a moment. ",
         "Thanks for reading it. ")
"""What a question may open with."""
JOINT = ("Please answer these:", "A few questions:", "I have some questions.")
"""What opens several questions asked in one turn."""


def vocabulary(docs: list[list[int]], tokenizer, least: int = 40) -> list[str]:
    """Words to build names from: the lowercase words of 4-10 letters of the training documents ``docs`` (token
    ids) by frequency, the 100 most frequent (function words, keywords) and :data:`_BANNED` left out, at most
    3,000 (rarer ones are mostly identifiers)."""
    counts = Counter(re.findall(r"(?<![A-Za-z_])[a-z]{4,10}(?![A-Za-z_])", "\n".join(tokenizer.decode(doc)
                                                                                     for doc in docs)))
    ranked = sorted(counts, key=lambda word: (-counts[word], word))
    words = [word for word in ranked[100:] if word not in _BANNED][:3000]
    if len(words) < least:
        raise UsageError(f"the training documents hold {len(words)} usable words; recall windows need {least}")
    return words


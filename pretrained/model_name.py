"""A model's name as its rows and reports carry it (its folder's), checked before a run: shown as it is, and never
read as another model's. Probes 10–13 ran models under names a report showed otherwise (a newline, a zero-width
space, a Hangul filler) or that read as the default model's (a Cyrillic ``һ``, a fullwidth ``２``, a dotless ``ı``).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from pathlib import Path

from runtime.errors import UsageError

BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")
"""Letters and symbols that draw nothing: the Hangul fillers (U+115F, U+1160, U+3164, U+FFA0) and the Braille blank
(U+2800), outside Unicode's "other" categories that :func:`_unseen` refuses whole."""

_WRITTEN_TOGETHER = ({"LATIN", "HAN", "HIRAGANA", "KATAKANA"}, {"LATIN", "HAN", "BOPOMOFO"},
                     {"LATIN", "HAN", "HANGUL"})
"""The scripts one name may mix (UTS #39's highly restrictive level): the ways Japanese, Chinese and Korean are
written, each beside Latin."""
_SCRIPT_OF_WORD = {"CJK": "HAN", "IDEOGRAPHIC": "HAN", "KATAKANA-HIRAGANA": "KATAKANA", "ARABIC-INDIC": "ARABIC",
                   "EXTENDED": "ARABIC"}
"""Unicode names whose first word is not their script's: Han ideographs and marks (``CJK UNIFIED IDEOGRAPH``,
``IDEOGRAPHIC ITERATION MARK``), the prolonged sound mark ``ー``, the (extended) Arabic-Indic digits."""
_LATIN_LOOKALIKES = dict(zip("ıȷǀɩɪʟɡɑɒʏʙᴅʜᴋɴᴏᴘʀᴛᴜᴠᴡᴢĸƖǃ", "ijliilgaaybdhknoprtuvwzkl!"))
"""Latin letters outside ASCII that read as an ASCII one and decompose to none (UTS #39's confusables among Latin
letters): the dotless ``ı`` for ``i``, the dental click ``ǀ`` for ``l``, the small capitals."""


def check_model_name(directory: Path, known: Iterable[str]) -> None:
    """``UsageError`` where ``directory``'s name (the model's, as rows and reports carry it) would not show as it is
    (:func:`_unseen`), could pass for another name (:func:`_lookalike`), or reads as one of the ``known`` models'
    names (the catalogue's, the default model's) without being it (:func:`_reads_as`)."""
    name, where = directory.name, f"model {directory.name!r} in {directory.parent}: its name (its folder's, which " \
                                  "its rows and reports carry)"
    unseen = _unseen(name)
    if unseen is not None:
        raise UsageError(f"{where} holds {unseen}; a model's name is visible characters, spaces only between them, so "
                         "that reports show it as it is; give the model a folder of such a name (a link to it will do)")
    lookalike = _lookalike(name)
    if lookalike is not None:
        raise UsageError(f"{where} {lookalike}, so that it reads as another model's name does; give the model a folder "
                         "of a name in one script, its punctuation ASCII (a link to it will do)")
    read_as = _reads_as(name, known)
    if read_as is not None:
        raise UsageError(f"{where} reads as the model {read_as[0]!r} ({read_as[1]}) but is another name, so that its "
                         "rows would read as that model's; give the model a folder of a name of its own (a link to it "
                         "will do)")


def _unseen(name: str) -> str | None:
    """What of ``name`` a report would not show as it is, said as a message does, or None: a control character (a
    newline began a heading of its own in summary.md, probe 10), one that shows nothing (a zero-width space, a
    direction mark: Unicode's "other" categories, unassigned and undecodable bytes among them), whitespace but a
    plain space, or spaces at either end (``"hybrid-byte-12l "`` read as the default model's name); nor a blank
    letter or symbol (:data:`BLANK_LETTERS`) or a combining mark (variation selectors and the combining grapheme
    joiner among them), which render as nothing on their own (``"hybrid-byte-12l\u3164"``, probe 11)."""
    if name != name.strip():
        return "whitespace at its start or end"
    for i, char in enumerate(name):
        category = unicodedata.category(char)
        if (category.startswith("C") or category in ("Mn", "Me") or char in BLANK_LETTERS
                or (char.isspace() and char != " ")):
            return f"the character {char!r} (U+{ord(char):04X}) at {i}"
    return None


def _lookalike(name: str) -> str | None:
    """What of ``name`` could pass for another name, said as a message does, or None: a compatibility form of another
    character (a fullwidth ``ｌ`` or ``２`` for ``l`` and ``2``), a character outside ASCII that is no letter or digit
    (U+2010 HYPHEN for ``-``), or letters and digits of scripts no one writes together (a Cyrillic ``һ`` among Latin
    letters: ``һybrid-byte-12l`` read as the default model, probe 12; an Arabic-Indic ``١`` among them). Scripts
    written together are Unicode's (UTS #39, highly restrictive): Han with Hiragana and Katakana, with Bopomofo, or
    with Hangul, each also with Latin, so ``日本語モデル`` and ``qwen-日本語`` are names."""
    scripts: dict[str, list[str]] = {}  # each script of the name's letters and digits: its characters there
    for char in name:
        if char.isascii() and not char.isalpha():
            continue
        if unicodedata.normalize("NFKC", char) != char:
            return f"holds {_named(char)}, a compatibility form of {unicodedata.normalize('NFKC', char)!r}"
        if not unicodedata.category(char).startswith(("L", "N")):
            return f"holds {_named(char)}, a character outside ASCII that is no letter or digit"
        scripts.setdefault(_script(char), []).append(char)
    if len(scripts) > 1 and not any(set(scripts) <= together for together in _WRITTEN_TOGETHER):
        ordered = sorted(scripts, key=lambda script: len(scripts[script]))  # the fewest stand in for another's
        fewest, most = ordered[0], ordered[-1]
        return f"mixes scripts: {_named(scripts[fewest][0])}, of the {fewest} script, among {most} characters"
    return None


def _reads_as(name: str, known: Iterable[str]) -> tuple[str, str] | None:
    """The ``known`` name that ``name`` reads as though it is not that name, and the first character of ``name``
    that stands for another, said as a message does; or None. Two names read alike where they are equal once each
    non-ASCII letter is read as the ASCII one it stands for: its base letter without accents (``í`` for ``i``), or
    its look-alike (:data:`_LATIN_LOOKALIKES`). ASCII is taken as it is: ``hybrid-byte-121`` is a name of its own."""
    skeleton = _skeleton(name)
    for other in known:
        if other != name and _skeleton(other) == skeleton:
            char = next(c for c, o in zip(name, other) if c != o)
            return other, f"its {_named(char)} for {_skeleton(char)!r}"
    return None


def _skeleton(name: str) -> str:
    """``name`` with each non-ASCII letter read as the ASCII letter it stands for, where it stands for one."""
    read = []
    for char in name:
        if not char.isascii():
            base = "".join(c for c in unicodedata.normalize("NFKD", char) if not unicodedata.combining(c))
            char = _LATIN_LOOKALIKES.get(base, base)
        read.append(char)
    return "".join(read)


def _script(char: str) -> str:
    """The script of the letter or digit ``char``, from its Unicode name's first word (``LATIN``, ``CYRILLIC``,
    ``GREEK``, ``DEVANAGARI``); an ASCII letter's is ``LATIN``."""
    word = unicodedata.name(char, "UNNAMED").split()[0]
    return _SCRIPT_OF_WORD.get(word, word)


def _named(char: str) -> str:
    """``char`` as a message names it: itself, its code point and its Unicode name."""
    return f"{char!r} (U+{ord(char):04X} {unicodedata.name(char, 'UNNAMED')})"

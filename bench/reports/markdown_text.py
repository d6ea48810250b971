"""Text set into the Markdown of ``leaderboard.md`` and ``summary.md`` as it is: a method's label, whatever it holds.

A label may hold any text a press's option takes (a chat template's ``<start_of_turn>model%0A``, ``<think>``): on
GitHub an unknown tag is dropped, ``<s>`` strikes through, ``*`` and ``_`` emphasise and ``&lt;`` is ``<``, so two
labels could show alike (probe 16, U2). Each such character is set behind a backslash, which CommonMark shows as the
character itself; an ``_`` between two letters or digits emphasises nothing (``head_shares``) and is left, so a label
that holds none of them is written as it is. A label shows ``|``, a table's column, as ``%7C`` already
(:data:`bench.run.specs.ESCAPED`). :func:`unescaped` reads a cell back (the page shows text as it is).
"""

from __future__ import annotations

import re

_ACTIVE = re.compile(r"[\\`*<>\[\]~&$]|(?<![^\W_])_|_(?![^\W_])")
"""A character Markdown may read as markup in a table cell: an ``_`` not between two letters or digits."""
_ESCAPED = re.compile(r"\\([\\`*<>\[\]~&$_])")


def escaped(text: str) -> str:
    """``text`` as Markdown that shows it as it is: each character of :data:`_ACTIVE` behind a backslash."""
    return _ACTIVE.sub(lambda match: "\\" + match.group(), text)


def unescaped(text: str) -> str:
    """The text :func:`escaped` wrote as ``text``."""
    return _ESCAPED.sub(r"\1", text)

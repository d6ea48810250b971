"""Whether a method's label reads back as itself: the text a row names its press or allocator by is what this bench
writes of some setting (:func:`bench.run.specs.Spec.label`), ``name`` or ``name(key=value,...)`` with its keys once
each and sorted, each text shown escaped (:func:`bench.run.specs.shown_text`) and a list's numbers joined by ``;``.

A label that does not — written by an older bench, which took a ``%`` in a text option as itself, by hand or by
another tool (``%20`` for a space, a lowercase ``%0a``, a raw ``|``) — names no method a rerun could match, and beside
the label of its setting it would read as a second method of that setting, with a folder and table row of its own
(probe 17, #4). ``bench carry`` refuses it before any context is rerun, every reader of a store as a row's problem
(:mod:`bench.store.row_checks`).

Nor does a label of a press or allocator registered here that names its setting otherwise than a run does (an option
at its default, another name of its class: probe 18, #3). Telling those needs the run room, which builds settings and
which this room may not import: the ``bench`` command hands its check over (:func:`check_settings_with`,
:mod:`bench.run.label_settings`); a library reader that is not handed it checks labels as text alone.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from functools import lru_cache

from presses.registry import KVPRESS_PREFIX
from runtime.errors import UsageError
from runtime.options import METHOD_NAME, unescaped


def shown_text(value: str) -> str:
    """``value`` as a label shows a text option's value: :func:`bench.run.specs.shown_text`'s rule, written again
    here because the store room imports no other (tests/test_import_graph.py); a test holds the two to one answer
    (tests/bench/test_label_read_back.py)."""
    return "".join("".join(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))
                   if char in _ESCAPED or not _printable(char) else char for char in value)


_ESCAPED = "%|/,;[]"
""":data:`bench.run.specs.ESCAPED`."""
_NOT_SHOWN = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"}


def _printable(char: str) -> bool:
    """:func:`bench.run.specs._printable`: printable by Unicode 3.2, the database every Python ships frozen."""
    return char == " " or unicodedata.ucd_3_2_0.category(char) not in _NOT_SHOWN

CACHED_LABELS = 4096
"""How many labels' answers are kept: a store holds some 35,000 rows naming a dozen labels, each checked once."""
OLDER_BENCH = ("If {key} is a text option, an older bench wrote it, which took a '%' in a text as itself (this one "
               "reads %XX as an escape and shows '%' as %25); if not, it was written by hand or by another tool")
"""Why a value holding a ``%`` is no text this bench shows: before b9e8e9e a text option's ``%`` was shown as it is
(``50% off``), which no longer reads back (``50% off`` starts no escape; ``a%41`` reads as ``aA``). The option's type
is its class's, which this room does not read: no bench wrote a ``%`` in a number (probe 21, U3)."""
NO_RERUN = "so its rows name no method a rerun here could match"


_setting_check: Callable[[str, str], str | None] | None = None
"""The run room's check of a label's setting (:func:`check_settings_with`), or None before it is imported."""


def check_settings_with(check: Callable[[str, str], str | None]) -> None:
    """Have :func:`read_back_problem` ask ``check(label, kind)`` too, of a label that reads back as text: why the
    setting a run builds of it is labelled otherwise, or None (:func:`bench.run.label_settings.setting_problem`)."""
    global _setting_check
    _setting_check = check


def read_back_problem(label: str, kind: str) -> str | None:
    """Why ``label``, a press's (``kind`` ``"press"``) or an allocator's (``"allocator"``), does not read back as
    itself (:func:`text_problem`, then the run room's check of its setting where it is imported:
    :func:`check_settings_with`), as one sentence naming it, or None where it does."""
    problem = text_problem(label, kind)
    if problem is None and _setting_check is not None:
        problem = _setting_check(label, kind)
    return problem


@lru_cache(maxsize=CACHED_LABELS)
def text_problem(label: str, kind: str) -> str | None:
    """Why ``label`` does not read back as itself as text, as one sentence naming it (``the label '...' cannot be
    read back: ...``), or None where it does: a name, and options (if any) of ``key=value`` pairs in brackets, each
    key a field name, once, in sorted order, and each value, each ``;``-separated item of a list, the text this
    bench shows of what it reads as (``shown_text(unescaped(item)) == item``). A value holding a ``%`` is blamed on an
    older bench (:data:`OLDER_BENCH`); anything else is named as written by hand or by another tool, with the label
    this bench shows of that setting where there is one."""
    name, bracket, body = label.partition("(")
    problem = _shape_problem(name, bracket, body, kind)
    if problem:
        return (f"the label {label!r} cannot be read back: {problem}; it was written by hand or by another tool "
                f"(this bench writes no such label), {NO_RERUN}")
    if not bracket:
        return None
    pairs = [pair.partition("=")[::2] for pair in body[:-1].split(",")]
    keys = [key for key, _ in pairs]
    repeated = next((key for key in keys if keys.count(key) > 1), None)
    if repeated is not None:
        return (f"the label {label!r} cannot be read back: its option {repeated} is given {keys.count(repeated)} "
                f"times, where this bench shows each option once; it was written by hand or by another tool, "
                f"{NO_RERUN}")
    for key, value in pairs:
        problem = _value_problem(key, value)
        if problem and "%" in value:
            return f"the label {label!r} cannot be read back: {problem}. {OLDER_BENCH.format(key=key)}, {NO_RERUN}"
        if problem:
            return (f"the label {label!r} cannot be read back: {problem}; it was written by hand or by another tool, "
                    f"and this bench shows that setting as {_canonical(name, pairs)!r}, {NO_RERUN}")
    if keys != sorted(keys):
        return (f"the label {label!r} cannot be read back: its options are not in the order of their keys "
                f"({', '.join(keys)}); it was written by hand or by another tool, and this bench shows that setting "
                f"as {_canonical(name, pairs)!r}, {NO_RERUN}")
    return None


def _shape_problem(name: str, bracket: str, body: str, kind: str) -> str | None:
    """What of ``name(body`` is not ``name`` or ``name(key=value,...)``: an empty name, or one no registry or
    ``kvpress:`` class is named by (a press's: no allocator is), options without their closing bracket or none in
    them, a pair without ``=`` or whose key is no field name."""
    if not name:
        return "it names no press or allocator before its options"
    if kind == "allocator" and name.startswith(KVPRESS_PREFIX):  # probe 21, #5
        return f"its name {name!r} is a kvpress press's, and no allocator is named {KVPRESS_PREFIX}<class>"
    if not (METHOD_NAME.fullmatch(name) or (name.startswith(KVPRESS_PREFIX)
                                            and name.removeprefix(KVPRESS_PREFIX).isidentifier())):
        return (f"its name {name!r} is neither a registered name (ASCII letters, digits, '_', '-' and '.', beginning "
                f"with a letter) nor {KVPRESS_PREFIX}<class>")
    if not bracket:
        return None
    if not body.endswith(")"):
        return "its options have no closing ')'"
    if body == ")":
        return "its brackets hold no options"
    for pair in body[:-1].split(","):
        key, equals, _ = pair.partition("=")
        if not equals or not key.isidentifier():
            return f"its option {pair!r} is no key=value pair of a field name and its value"
    return None


def _value_problem(key: str, value: str) -> str | None:
    """Why the text ``value`` of the option ``key`` is no text this bench shows of any value (each ``;``-separated
    item of a list alone), or None."""
    try:
        text = unescaped(value)
    except UsageError as error:
        return f"its {key} {value!r} is no text this bench shows ({str(error).partition(':')[0]})"
    shown = _shown(value)
    if shown == value:
        return None
    if "%" in value:
        return (f"its {key} {value!r} is no text this bench shows (read as escapes it is {text!r}, which this bench "
                f"shows as {shown!r})")
    return f"its {key} {value!r} is no text this bench shows (it shows that text as {shown!r})"


def _shown(value: str) -> str:
    """``value`` as this bench shows what it reads as: each ``;``-separated item of a list read and shown alone (a
    text's own ``;`` is shown ``%3B``)."""
    return ";".join(shown_text(unescaped(item)) for item in value.split(";"))


def _canonical(name: str, pairs: list[tuple[str, str]]) -> str:
    """The label this bench shows of the setting ``name`` with the options ``pairs`` (each key once), each value
    that reads as escapes shown as this bench shows it."""
    shown = []
    for key, value in sorted(pairs):
        try:
            shown.append(f"{key}={_shown(value)}")
        except UsageError:  # no escapes: what it means is unknown, so it stays as it is
            shown.append(f"{key}={value}")
    return f"{name}({','.join(shown)})"

"""What one method of a comparison is: a press and an allocator, each a registry name with its own options.

A method is written ``press[key=value,...]/allocator[key=value,...]`` on the command line (``--methods``; ``--press``
and ``--alloc`` take the same ``name[options]`` items): the options in brackets are that press's or allocator's
alone, typed by its fields (:mod:`runtime.options`). :func:`split_items` splits such a list at the separators outside
brackets, so that a bracket may hold several options (``snapkv[window=64,kernel=5]``) and a list option its ``/``
(``perlayer[weights=1/2/3]``).

A spec's :attr:`~PressSpec.label` is the name rows record, computed once: the name alone without options, else
``name(key=value,...)`` with the typed values, keys sorted, lists joined by ``;`` (so that a row's method
``press/allocator`` holds exactly one ``/``); an option that names a directory the press reads (GateSight's
``estimator``, TriAttention's ``calibration``) is shown by those files' content fingerprint, not by its path, so that
the label changes with what the press reads. A text option shows ``%XX`` escapes (:func:`shown_text`) for what a
label cannot show as it is (``%``, ``|``, its own punctuation, a newline or another character that is not
printable), and the command line's items take the same escapes in a text option's value (KVzip's
``kvzip[suffix=<|im_end|>%0A<|im_start|>assistant%0A]``): a label reads back as its item. A spec is its label: two
specs of one label are one setting. No prune is :data:`BASELINE_METHOD`, ``none``/``none``.
"""

from __future__ import annotations

import numbers
import unicodedata
from dataclasses import dataclass
from functools import cached_property

from presses.kvpress_names import class_alias
from presses.registry import KVPRESS_PREFIX
from runtime.errors import UsageError
from runtime.options import EscapedText

from ..store.row_fields import BASELINE

Options = tuple[tuple[str, object], ...]
"""``((key, typed value), ...)`` sorted by key, lists as tuples: hashable, so a spec is a dictionary key."""


def frozen_options(options: dict) -> Options:
    """``options`` (typed by their fields) as :data:`Options`."""
    return tuple(sorted((key, tuple(value) if isinstance(value, list) else value) for key, value in options.items()))


def press_name(name: str) -> str:
    """The one name of the press setting ``name`` names: a kvpress short name that is another name of a kvpress
    class (:func:`presses.kvpress_names.class_alias`: ``kvpress:knorm``) is that class's (``kvpress:KnormPress``),
    so that a run labels both alike and sees them as one setting; any other name is itself."""
    alias = class_alias(name.removeprefix(KVPRESS_PREFIX)) if name.startswith(KVPRESS_PREFIX) else None
    return name if alias is None else KVPRESS_PREFIX + alias


def _number(value) -> str:
    """A list entry as labels show it: every digit it has (two settings never share a label), an integer as itself
    (a float would show 10**16 as ``1e+16``, which an integer list does not read, and 2**53 + 1 as 2**53: probe 21,
    #3), a real number without a zero fraction (``1.0`` is ``1``)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return str(int(value))
    return repr(float(value)).removesuffix(".0")


LABEL_PUNCTUATION = "/,;[]"
"""What a label's grammar reads: ``/`` between a method's press and allocator, ``,`` between options, ``;`` between a
list's items, and the brackets of the ``name[options]`` item a label is read back to (``bench carry``)."""


ESCAPED = "%|" + LABEL_PUNCTUATION
"""What a label shows escaped, besides every character that is not printable: ``%``, the escape's own sign; ``|``, a
Markdown table's column (it added a cell to the method's rows of leaderboard.md, probe 14); and
:data:`LABEL_PUNCTUATION`, which would read as other options, a list or another method."""


_NOT_SHOWN = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"}
"""The categories of what Python calls not printable: controls, formats, surrogates, private use, unassigned, and
separators but the space."""


def _printable(char: str) -> bool:
    """Whether ``char`` is printable by Unicode 3.2, the database every Python ships frozen
    (``unicodedata.ucd_3_2_0``): by its own, newer database the answer moves with the Python (probe 18: U+1FAE8 was
    escaped by 3.11 and shown by 3.12, so each refused the other's label). A character newer than 3.2 (an emoji) is
    shown escaped."""
    return char == " " or unicodedata.ucd_3_2_0.category(char) not in _NOT_SHOWN


def shown_text(value: str) -> str:
    """A text option's ``value`` as its label shows it: each character of :data:`ESCAPED` and each one that is not
    printable by Unicode 3.2 (:func:`_printable`; a newline split a row of leaderboard.md in two) as ``%XX``, each
    byte of its UTF-8 in uppercase hex (``<|im_start|>`` is ``<%7Cim_start%7C>``), every other as it is (text without
    them shows as it was before such text was taken). This is how the command line writes it too
    (:class:`runtime.options.EscapedText`), so that a label reads back as the item it was given by (``bench carry``)."""
    return "".join("".join(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))
                   if char in ESCAPED or not _printable(char) else char for char in value)


def _label(name: str, options: Options, fingerprints: Options) -> str:
    if not options:
        return name
    shown = dict(options) | dict(fingerprints)
    return name + "(" + ",".join(f"{key}={_shown(value)}" for key, value in sorted(shown.items())) + ")"


def _shown(value) -> str:
    """An option's value as a label shows it: a list's numbers joined by ``;``, text escaped (:func:`shown_text`)."""
    if isinstance(value, tuple):
        return ";".join(map(_number, value))
    return shown_text(value) if isinstance(value, str) else str(value)


@dataclass(frozen=True, eq=False)
class Spec:
    """A registry name and its options, typed (``()`` for none); ``fingerprints`` are ``((key, content
    fingerprint), ...)`` of the options that name a directory the press reads (shown in the label instead)."""

    name: str
    options: Options = ()
    fingerprints: Options = ()

    @cached_property
    def label(self) -> str:
        """The name rows record (``snapkv(window=64)``, ``gatesight(estimator=3f2a9c01d4e7)``)."""
        return _label(self.name, self.options, self.fingerprints)

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other.label == self.label

    def __hash__(self) -> int:
        return hash((type(self), self.label))

    @property
    def kwargs(self) -> dict:
        """The options as keyword arguments of the registry's ``get`` (lists as lists)."""
        return {key: list(value) if isinstance(value, tuple) else value for key, value in self.options}


@dataclass(frozen=True, eq=False)
class PressSpec(Spec):
    """A press of :func:`presses.available` with its options."""


@dataclass(frozen=True, eq=False)
class AllocatorSpec(Spec):
    """An allocator of :func:`allocators.available` with its options."""


@dataclass(frozen=True)
class Method:
    """A press with an allocator: what one compacted child of a context runs (at some kept fraction)."""

    press: PressSpec
    allocator: AllocatorSpec

    @cached_property
    def label(self) -> str:
        """``press/allocator`` as reports name it (:func:`bench.store.row_fields.method_of`), ``none`` for no prune."""
        return BASELINE if self.is_baseline else f"{self.press.label}/{self.allocator.label}"

    @property
    def is_baseline(self) -> bool:
        return self.press.name == BASELINE


BASELINE_METHOD = Method(PressSpec(BASELINE), AllocatorSpec(BASELINE))
"""No prune: the full cache's own answers, in every run."""


def split_outside(text: str, separator: str, flag: str = "") -> list[str]:
    """``text`` split at each ``separator`` outside ``[...]``, each part stripped (empty ones kept); an unbalanced
    or nested bracket is a :class:`~runtime.errors.UsageError` naming ``flag`` and the text."""
    where = f"{flag} {text!r}".strip()
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise UsageError(f"{where}: a '[' inside brackets at character {i + 1}; options are "
                                 "name[key=value,...], one pair of brackets per name")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise UsageError(f"{where}: a ']' without its '[' at character {i + 1}")
        elif char == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise UsageError(f"{where}: a '[' is not closed; options are name[key=value,...]")
    parts.append(text[start:])
    return [part.strip() for part in parts]


def split_items(text: str, separator: str, flag: str = "") -> list[str]:
    """:func:`split_outside` without the empty parts (``a, b,,c``: three items)."""
    return [part for part in split_outside(text, separator, flag) if part]


def parse_item(text: str, flag: str) -> tuple[str, dict]:
    """``name[key=value,...]`` -> ``(name, {key: value text})``; ``name`` alone has no options. Anything else (no
    name, text after ``]``, a pair without ``=``, a key twice) is a :class:`~runtime.errors.UsageError` naming it."""
    name, bracket, rest = text.partition("[")
    name = name.strip()
    if not name:
        raise UsageError(f"{flag} {text!r}: no name before its options; expected name[key=value,...]")
    if not bracket:
        return name, {}
    body, _, after = rest.rpartition("]")
    if after.strip():
        raise UsageError(f"{flag} {text!r}: {after.strip()!r} after the options' ']'; expected name[key=value,...]")
    options: dict = {}
    for pair in split_items(body, ",", flag):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{flag} {text!r}: {pair!r} is not key=value; expected name[key=value,...]")
        if key.strip() in options:
            raise UsageError(f"{flag} {text!r}: option {key.strip()!r} given twice")
        # text, escapes and all (an escaped ',' split no pair above): the press or allocator types it by its field
        options[key.strip()] = EscapedText(value.strip())
    return name, options


def parse_pair(text: str) -> tuple[str, str]:
    """A ``--methods`` item ``press[...]/allocator[...]`` -> its press and allocator items (the ``/`` of a list
    option inside brackets is not the pair's)."""
    parts = split_outside(text, "/", "--methods")
    if len(parts) != 2 or not all(parts):
        raise UsageError(f"--methods {text!r}: expected press/allocator, e.g. gatesight/gate or "
                         "snapkv[window=64]/flat")
    return parts[0], parts[1]

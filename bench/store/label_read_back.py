"""Whether a method's label reads back as itself: the text a row names its press or allocator by is what this bench
writes of some setting (:func:`bench.run.specs.Spec.label`), ``name`` or ``name(key=value,...)`` with its keys once
each and sorted, each text shown escaped (:func:`bench.run.specs.shown_text`) and a list's numbers joined by ``;``.

A label that does not — written by an older bench, which took a ``%`` in a text option as itself, by hand or by
another tool (``%20`` for a space, a lowercase ``%0a``, a raw ``|``) — names no method a rerun could match, and beside
the label of its setting it would read as a second method of that setting, with a folder and table row of its own
(probe 17, #4). ``bench carry`` refuses it before any context is rerun, every reader of a store as a row's problem
(:mod:`bench.store.row_checks`).

Nor does a label of a press or allocator registered here (:data:`presses.registry.PRESSES`, a ``kvpress:`` class,
:data:`allocators.ALLOCATORS`) that reads back as text but names its setting otherwise than a run does: an option at
its default (``snapkv(gqa=mean,window=16)``), one it has not (``windw``), a number written otherwise (``window=016``,
``weights=1;2.5;0.1``, which perlayer normalises), another name of its class (``kvpress:knorm``), a raw ``;`` in a
text (probe 18, #3). Its setting is rebuilt from it as a run builds one
(:func:`bench.run.methods._spec`), and the label is refused unless that setting's label is the same text. A press
or allocator not registered here (a user's module, which verify does not import) is checked as text alone, and so
is a label with an option that names an artifact folder (``gatesight(estimator=46e464d1a968)``: its files'
fingerprint, which only the folder itself, given to carry with ``--artifacts``, and the model can rebuild).
"""

from __future__ import annotations

from functools import lru_cache

import allocators
import presses
from allocators import ALLOCATORS
from presses.registry import KVPRESS_PREFIX, PRESSES
from runtime.errors import UsageError
from runtime.options import METHOD_NAME, unescaped

from ..run.methods import _spec
from ..run.specs import AllocatorSpec, PressSpec, shown_text

CACHED_LABELS = 4096
"""How many labels' answers are kept: a store holds some 35,000 rows naming a dozen labels, each checked once."""
OLDER_BENCH = ("An older bench wrote it, which took a '%' in a text option as itself (this one reads %XX as an escape "
               "and shows '%' as %25)")
"""Why a text holding a ``%`` is no text this bench shows: before b9e8e9e a text option's ``%`` was shown as it is
(``50% off``), which no longer reads back (``50% off`` starts no escape; ``a%41`` reads as ``aA``)."""
NO_RERUN = "so its rows name no method a rerun here could match"


def read_back_problem(label: str, kind: str) -> str | None:
    """Why ``label`` does not read back as itself, as one sentence naming it (``the label '...' cannot be read back:
    ...``), or None where it does: a name, and options (if any) of ``key=value`` pairs in brackets, each key a field
    name, once, in sorted order, and each value, each ``;``-separated item of a list, the text this bench shows of
    what it reads as (``shown_text(unescaped(item)) == item``); and where it names a press or allocator registered
    here, the label of the setting a run builds from it (:func:`_setting_problem`). A value holding a ``%`` is blamed
    on an older bench (:data:`OLDER_BENCH`); anything else is named as written by hand or by another tool, with the
    label this bench shows of that setting where there is one. ``kind`` is ``"press"`` or ``"allocator"``: the
    registry the name is looked up in (probe 19: a user's press named ``pyramid`` was rebuilt as the allocator)."""
    # the answer is cached per label and per class its name is registered as (a test registers and drops presses)
    return _text_problem(label) or _setting_problem(label, _registered(label.partition("(")[0], kind))


@lru_cache(maxsize=CACHED_LABELS)
def _text_problem(label: str) -> str | None:
    """Why ``label`` does not read back as itself as text (:func:`read_back_problem`), or None."""
    name, bracket, body = label.partition("(")
    problem = _shape_problem(name, bracket, body)
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
            return f"the label {label!r} cannot be read back: {problem}. {OLDER_BENCH}, {NO_RERUN}"
        if problem:
            return (f"the label {label!r} cannot be read back: {problem}; it was written by hand or by another tool, "
                    f"and this bench shows that setting as {_canonical(name, pairs)!r}, {NO_RERUN}")
    if keys != sorted(keys):
        return (f"the label {label!r} cannot be read back: its options are not in the order of their keys "
                f"({', '.join(keys)}); it was written by hand or by another tool, and this bench shows that setting "
                f"as {_canonical(name, pairs)!r}, {NO_RERUN}")
    return None


def _shape_problem(name: str, bracket: str, body: str) -> str | None:
    """What of ``name(body`` is not ``name`` or ``name(key=value,...)``: an empty name, or one no registry or
    ``kvpress:`` class is named by, options without their closing bracket or none in them, a pair without ``=`` or
    whose key is no field name."""
    if not name:
        return "it names no press or allocator before its options"
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


FLAG = "--methods"
"""The flag a rebuilt item is given as (:func:`bench.run.methods._spec` names it): left out of what is said, as the
label's reader gave none (probe 16, U1)."""


def _registered(name: str, kind: str) -> tuple:
    """The press (``kind`` ``"press"``) or allocator registered here as ``name``, ``((spec class, its name, its
    class),)``: a ``kvpress:`` name is a press of kvpress's; none for a name registered nowhere as it is written (a
    user's module verify does not import, whatever the case of its letters: probe 19, ``SnapKV``), whose label is
    checked as text alone."""
    if kind == "press" and name.startswith(KVPRESS_PREFIX):
        return ((PressSpec, name, None),)
    spec, registry = (PressSpec, PRESSES) if kind == "press" else (AllocatorSpec, ALLOCATORS)
    return ((spec, name, registry[name]),) if name in registry else ()


@lru_cache(maxsize=CACHED_LABELS)
def _setting_problem(label: str, registered: tuple) -> str | None:
    """Why no setting a run builds from ``label`` (one that reads back as text) as a press or allocator of
    ``registered`` (:func:`_registered`) is labelled ``label``, or None where one is, none is registered, or an option
    names an artifact folder (shown by its files' fingerprint: the folder and the model alone rebuild it)."""
    body = label.partition("(")[2]
    pairs = dict(pair.partition("=")[::2] for pair in body[:-1].split(",")) if body else {}
    problems = []
    for kind, known, cls in registered:
        if set(pairs) & set(getattr(cls, "artifact_files", {})):
            return None
        try:
            shown = _rebuilt(kind, known, pairs).label
        except ImportError:  # kvpress, which the serving install leaves out: its classes are unknown here
            return None
        except UsageError as error:
            problems.append(f"a run here builds no setting from it ({error}); it was written by hand or by another "
                            "tool (this bench writes no such label)")
            continue
        if shown == label:
            return None
        problems.append(f"it was written by hand or by another tool, and this bench shows that setting as {shown!r}")
    return f"the label {label!r} cannot be read back: {problems[0]}, {NO_RERUN}" if problems else None


def _rebuilt(kind, name: str, pairs: dict[str, str]):
    """The spec (``kind``) a run builds of the press or allocator ``name`` from a label's options ``pairs`` read back
    as an item (:func:`_item_value`: a list's ``;`` as ``/``). A text option's ``;`` is the text's own, which this
    bench shows as ``%3B`` (a label's list is numbers): such an option is read again as that (probe 18, #3)."""
    spec = _built(kind, name, pairs)
    texts = {key: pairs[key].replace(";", "%3B") for key, value in spec.options
             if isinstance(value, str) and ";" in pairs[key]}
    return _built(kind, name, pairs | texts) if texts else spec


def _built(kind, name: str, pairs: dict[str, str]):
    """The spec (``kind``) a run builds of ``name`` with the options ``pairs`` (label text); a
    :class:`~runtime.errors.UsageError` naming the item it was read as and why a run refuses it."""
    item = name + (f"[{','.join(f'{key}={_item_value(value)}' for key, value in pairs.items())}]" if pairs else "")
    try:
        return _spec(kind, item, FLAG, {}, presses if kind is PressSpec else allocators)
    except UsageError as error:
        raise UsageError(f"read as the item {item!r}: {str(error).removeprefix(f'{FLAG} {item!r}: ')}") from None


def _item_value(value: str) -> str:
    """A label's option value as an item gives it, as ``bench carry`` reruns a label (:func:`bench.run.carry._item`):
    a list's ``;`` as ``/``, and a space at either end as ``%20``, which the item would lose as it is read."""
    body = value.strip(" ")
    lead = len(value) - len(value.lstrip(" "))
    return "%20" * lead + body.replace(";", "/") + "%20" * (len(value) - lead - len(body))

"""Whether a label of a press or allocator registered here names its setting as a run does.

A label that reads back as text (:mod:`bench.store.label_read_back`) may still name its setting otherwise than a run
writes it: an option at its default (``snapkv(gqa=mean,window=16)``), one the press has not (``windw``), a number
written otherwise (``window=016``, ``weights=1;2.5;0.1``, which perlayer normalises), another name of its class
(``kvpress:knorm``), a raw ``;`` in a text. Beside its setting's own label it would read as a second method of one
setting, and ``bench carry`` would rerun it only to blame the code (probe 18, #3). Its setting is rebuilt here as a
run builds one (:func:`bench.run.methods._spec`) and the label is refused unless that setting's label is the same
text. The store room imports no other room: the ``bench`` command hands this check to its readers
(:func:`bench.store.label_read_back.check_settings_with`), and ``bench carry`` asks it itself. It decides no row's
values, so no group's shared code holds it (:func:`bench.store.code_version.result_modules`).

A name is looked up in its own kind's registry by its exact text (:data:`presses.registry.PRESSES` or a ``kvpress:``
class for a press, :data:`allocators.ALLOCATORS` for an allocator): a user's press named ``SnapKV`` or ``pyramid``,
not imported where the store is read, is no registered setting and is checked as text alone (probe 19, #1). An
option that names an artifact folder is shown by its files' fingerprint (``gatesight(estimator=46e464d1a968)``), which
only the folder itself, given to carry with ``--artifacts``, rebuilds: it must be one, and the rest of the label is
rebuilt without it (probe 21, #1). A run checks its own labels so before any work (:func:`check_labels_rebuild`): a
class that changes its options again as it is built from them could write no label its readers take (probe 21, #2).
"""

from __future__ import annotations

import re
from functools import lru_cache

import allocators
import presses
from allocators import ALLOCATORS
from presses.registry import KVPRESS_PREFIX, PRESSES
from runtime.errors import UsageError

from ..store.label_read_back import NO_RERUN
from .methods import _held, _spec
from .specs import AllocatorSpec, PressSpec, frozen_options

FINGERPRINT = re.compile("[0-9a-f]{12}")
"""An artifact option's value in a label: its files' fingerprint (:func:`pretrained.fingerprints.files_fingerprint`)."""
PROJECT_PACKAGES = ("presses", "allocators")
"""Where the project's presses and allocators are defined: a class of another module is a user's."""
CACHED_LABELS = 4096
"""How many labels' answers are kept: a store holds some 35,000 rows naming a dozen labels, each checked once."""
FLAG = "--methods"
"""The flag a rebuilt item is given as (:func:`bench.run.methods._spec` names it): left out of what is said, as the
label's reader gave none (probe 16, U1)."""


def setting_problem(label: str, kind: str) -> str | None:
    """Why no setting a run builds from ``label`` (a label that reads back as text) is labelled ``label``, as one
    sentence naming it (``the label '...' cannot be read back: ...``), or None where one is, or where its name is
    registered nowhere as a ``kind`` (``"press"`` or ``"allocator"``)."""
    # cached per label and per class its name is registered as (a test registers and drops presses)
    return _setting_problem(label, _registered(label.partition("(")[0], kind))


def rebuilt_label(label: str, kind: str) -> str | None:
    """The label of the setting a run builds from ``label`` as a ``kind``, or None where its name is registered
    nowhere as one (or is a kvpress class, and kvpress is not installed); a :class:`~runtime.errors.UsageError` where
    a run builds no setting from it."""
    registered = _registered(label.partition("(")[0], kind)
    return _rebuilt_label(label, *registered[0]) if registered else None


def check_labels_rebuild(methods) -> None:
    """``UsageError``, before any work, naming the first press or allocator of ``methods`` whose label names no
    setting, or another: its class changes its options as it is built (its ``__post_init__``), so that a build from
    the label gives other values (one that scales a list to sum 1 moves its floats again: probe 21, #2), values no
    label reads (probe 22, U1), or, for a press, whose label shows the values it was given, values other than the
    label's (one that clamps ``level=9`` to 5 ran as two settings: probe 22, #3)."""
    specs = {(spec, kind) for method in methods for spec, kind in ((method.press, "press"),
                                                                    (method.allocator, "allocator"))}
    for spec, kind in sorted(specs, key=lambda pair: (pair[1], pair[0].label)):
        why = None
        try:
            shown = rebuilt_label(spec.label, kind)
        except UsageError as error:
            why = f"its own label {spec.label!r} builds no setting ({error})"
        else:
            if shown is not None and shown != spec.label:
                why = f"built from its own label {spec.label!r}, it shows {shown!r}"
            elif kind == "press" and spec.name in PRESSES:
                why = _moved_options(spec)
        if why is not None:
            raise UsageError(f"{kind} {spec.name}: {why}: its class changes its options as it is built (its "
                             "__post_init__), so no label names its setting; make a build keep the values it is "
                             "given, or give again the values it made (round them)")


def _moved_options(spec) -> str | None:
    """What of a press's options its build holds otherwise than it was given (its label shows what it was given), or
    None; an option naming an artifact folder is the folder's, which the build reads."""
    built = presses.get(spec.name, **spec.kwargs)
    artifacts = getattr(PRESSES[spec.name], "artifact_files", {})
    for key, value in spec.options:
        held = _held(built, spec.name, key)
        if key not in artifacts and held != (list(value) if isinstance(value, tuple) else value):
            return f"given {key}={value!r}, it holds {key}={held!r}"
    return None


def _registered(name: str, kind: str) -> tuple:
    """``((spec class, class),)`` of the press (``kind`` ``"press"``) or allocator registered here as ``name``, the
    class None for a ``kvpress:`` press; ``()`` for a name registered nowhere as it is written."""
    if kind == "press" and name.startswith(KVPRESS_PREFIX):
        return ((PressSpec, None),)
    spec, registry = (PressSpec, PRESSES) if kind == "press" else (AllocatorSpec, ALLOCATORS)
    return ((spec, registry[name]),) if name in registry else ()


@lru_cache(maxsize=CACHED_LABELS)
def _setting_problem(label: str, registered: tuple) -> str | None:
    """:func:`setting_problem` of ``label`` as a press or allocator of ``registered`` (:func:`_registered`)."""
    if not registered:
        return None
    try:
        shown = _rebuilt_label(label, *registered[0])
    except UsageError as error:
        return (f"the label {label!r} cannot be read back: a run here builds no setting from it ({error}); it was "
                f"written by hand or by another tool (this bench writes no such label), {NO_RERUN}")
    if shown is None or shown == label:
        return None
    name, cls = label.partition("(")[0], registered[0][1]
    if name != shown.partition("(")[0]:  # kvpress:knorm, which an older bench wrote for KnormPress (probe 21, #4)
        why = (f"{name} is another name of {shown.partition('(')[0]} (an older bench wrote it so), and this bench "
               f"shows that setting as {shown!r}")
    elif cls is not None and cls.__module__.split(".")[0] not in PROJECT_PACKAGES:
        why = (f"{name} as its module {cls.__module__} is imported here shows that setting as {shown!r}: the module "
               "changed since the label was written (a default or an option), or the label was written by hand")
    else:
        why = f"it was written by hand or by another tool, and this bench shows that setting as {shown!r}"
    return f"the label {label!r} cannot be read back: {why}, {NO_RERUN}"


def _rebuilt_label(label: str, kind, cls) -> str | None:
    """The label of the setting (``kind``) a run builds from ``label``, a press or allocator of the class ``cls``
    (None for a kvpress press); None where kvpress is not installed. An option naming an artifact folder is shown by
    its files' fingerprint, which the folder alone rebuilds: it must be one (12 hex digits), and the rest of the
    label is rebuilt without it (probe 21, #1)."""
    name, _, body = label.partition("(")
    pairs = dict(pair.partition("=")[::2] for pair in body[:-1].split(",")) if body else {}
    artifacts = {key: value for key, value in pairs.items() if key in getattr(cls, "artifact_files", {})}
    for key, value in artifacts.items():
        if not FINGERPRINT.fullmatch(value):
            raise UsageError(f"its {key} {value!r} is no fingerprint of a folder's files, 12 hex digits, as a run "
                             "shows the folder it is given")
    try:
        spec = _rebuilt(kind, name, {key: value for key, value in pairs.items() if key not in artifacts})
    except ImportError:  # kvpress, which the serving install leaves out: its classes are unknown here
        return None
    if not artifacts:
        return spec.label
    return kind(spec.name, frozen_options(dict(spec.options) | artifacts), frozen_options(artifacts)).label


def _rebuilt(kind, name: str, pairs: dict[str, str]):
    """The spec (``kind``) a run builds of the press or allocator ``name`` from a label's options ``pairs`` read back
    as an item (:func:`item_value`: a list's ``;`` as ``/``). A text option's ``;`` is the text's own, which this
    bench shows as ``%3B`` (a label's list is numbers): such an option is read again as that (probe 18, #3)."""
    spec = _built(kind, name, pairs)
    texts = {key: pairs[key].replace(";", "%3B") for key, value in spec.options
             if isinstance(value, str) and ";" in pairs[key]}
    return _built(kind, name, pairs | texts) if texts else spec


def _built(kind, name: str, pairs: dict[str, str]):
    """The spec (``kind``) a run builds of ``name`` with the options ``pairs`` (label text); a
    :class:`~runtime.errors.UsageError` naming the item it was read as and why a run refuses it."""
    item = name + (f"[{','.join(f'{key}={item_value(value)}' for key, value in pairs.items())}]" if pairs else "")
    try:
        return _spec(kind, item, FLAG, {}, presses if kind is PressSpec else allocators)
    except UsageError as error:
        raise UsageError(f"read as the item {item!r}: {str(error).removeprefix(f'{FLAG} {item!r}: ')}") from None


def item_value(value: str) -> str:
    """A label's option value as an item gives it: a list's ``;`` as ``/``, and a space at either end as ``%20``,
    which the item would lose as it is read."""
    body = value.strip(" ")
    lead = len(value) - len(value.lstrip(" "))
    return "%20" * lead + body.replace(";", "/") + "%20" * (len(value) - lead - len(body))

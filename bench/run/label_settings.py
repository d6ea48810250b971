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
not imported where the store is read, is no registered setting and is checked as text alone (probe 19, #1). So is a
label with an option that names an artifact folder (``gatesight(estimator=46e464d1a968)``: its files' fingerprint,
which only the folder itself, given to carry with ``--artifacts``, and the model can rebuild).
"""

from __future__ import annotations

from functools import lru_cache

import allocators
import presses
from allocators import ALLOCATORS
from presses.registry import KVPRESS_PREFIX, PRESSES
from runtime.errors import UsageError

from ..store.label_read_back import NO_RERUN
from .methods import _spec
from .specs import AllocatorSpec, PressSpec

CACHED_LABELS = 4096
"""How many labels' answers are kept: a store holds some 35,000 rows naming a dozen labels, each checked once."""
FLAG = "--methods"
"""The flag a rebuilt item is given as (:func:`bench.run.methods._spec` names it): left out of what is said, as the
label's reader gave none (probe 16, U1)."""


def setting_problem(label: str, kind: str) -> str | None:
    """Why no setting a run builds from ``label`` (a label that reads back as text) is labelled ``label``, as one
    sentence naming it (``the label '...' cannot be read back: ...``), or None where one is, where its name is
    registered nowhere as a ``kind`` (``"press"`` or ``"allocator"``), or where an option names an artifact folder.
    """
    # cached per label and per class its name is registered as (a test registers and drops presses)
    return _setting_problem(label, _registered(label.partition("(")[0], kind))


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
    (kind, cls), = registered
    name, _, body = label.partition("(")
    pairs = dict(pair.partition("=")[::2] for pair in body[:-1].split(",")) if body else {}
    if set(pairs) & set(getattr(cls, "artifact_files", {})):
        return None
    try:
        shown = _rebuilt(kind, name, pairs).label
    except ImportError:  # kvpress, which the serving install leaves out: its classes are unknown here
        return None
    except UsageError as error:
        return (f"the label {label!r} cannot be read back: a run here builds no setting from it ({error}); it was "
                f"written by hand or by another tool (this bench writes no such label), {NO_RERUN}")
    if shown == label:
        return None
    return (f"the label {label!r} cannot be read back: it was written by hand or by another tool, and this bench "
            f"shows that setting as {shown!r}, {NO_RERUN}")


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

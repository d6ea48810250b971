"""Getting presses ready for a model: the one path from a name to a press that can score its contexts.

Every caller — ``bench compare``, ``bench cost``, :class:`presses.Selection`, the vLLM worker — prepares a press the
same way: built by name with its options, bound to the artifacts in the model's directory, checked against the
model, and the prefill evidence of all presses in use combined into one request.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from pretrained.model_info import ModelInfo, model_of, read
from runtime import EvidenceRequest
from runtime.adapters import ModelAdapter
from runtime.errors import UsageError
from runtime.user_code import UserCodeError, run_users

from .base import Press
from .registry import get
from .score_check import press_label

REFUSALS = (ValueError, FileNotFoundError)
"""What :meth:`Press.bind` and :meth:`Press.check` raise where a press cannot run on a model (its artifacts missing,
damaged or another model's): said as such, a user's press's too, not as its code failing."""


def press_call(press: Press, method: str, /, *arguments, passing: tuple[type[Exception], ...] = (), model=None):
    """``press.method(*arguments)`` (``method`` one of :class:`Press`'s own: ``bind``, ``check``, ``evidence`` …),
    whose failure in a user's press is one line naming it, and which is held to leave ``model`` (the torch module it
    is given, through an adapter) as it found it (:func:`runtime.user_code.run_users`); ``passing``: what the method
    raises by its contract, passed on."""
    return run_users(lambda: getattr(press, method)(*arguments), type(press), f"press {press_label(press)}",
                     f"in {method}", passing=passing, model=model)


def prepare(press: Press | str, adapter: ModelAdapter, model: ModelInfo | str | os.PathLike | None = None,
            **options) -> Press:
    """``press`` (an instance, or a registry name built with ``options``) bound and checked for ``adapter``'s model.

    Parameters
    ----------
    press : Press or str
        A press, or a name of :func:`presses.available` (``kvpress:<Class>`` included).
    adapter : ModelAdapter
        The model the press will score contexts of.
    model : ModelInfo or str or PathLike, optional
        The model as read once (:func:`pretrained.model_info.read`; a directory is read here): where the press's
        artifacts live (GateSight's estimator, TriAttention's calibration) and its weights' fingerprint they are
        checked against; default: the directory the adapter's model was loaded from, read now
        (:func:`pretrained.model_info.model_of`).

    Raises
    ------
    UsageError
        An unknown name or option, or a press that cannot run on this model (its reason, and the directory).
    """
    shown = press if isinstance(press, str) else press.name
    if isinstance(press, str):
        press = get(press, **options)
    elif options:
        raise UsageError(f"options {sorted(options)} are for a press built by name; {press.name!r} is built already")
    model = model_of(adapter) if model is None else read(model)
    try:
        press_call(press, "bind", model, passing=REFUSALS)  # given the model's files, not the model
        press_call(press, "check", adapter, passing=REFUSALS, model=adapter.model)
    except UserCodeError:  # a UsageError, and so a ValueError too: said as it is
        raise
    except REFUSALS as error:
        raise UsageError(f"press {shown!r} cannot run on {None if model is None else model.directory}: {error}") \
            from None
    return press


def evidence_for(presses: Iterable[Press], adapter: ModelAdapter) -> EvidenceRequest:
    """The one prefill request that records what every press in ``presses`` reads."""
    request = EvidenceRequest()
    for press in presses:
        request = request | press_call(press, "evidence", adapter, model=adapter.model)
    return request

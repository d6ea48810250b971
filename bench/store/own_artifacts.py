"""A label that names the model's own artifact by its fingerprint names the setting without that option.

A press that reads an artifact folder (GateSight's estimator, TriAttention's calibration) reads the model's own by
default, and a run given that folder leaves the option out (:func:`bench.run.methods._spec`): one setting, one label.
A label that shows the model's own files' fingerprint (``gatesight(estimator=930f4c82ef32)`` for the default model)
is then no label a run writes, and beside the plain ``gatesight`` it would read as a second method of one setting
(probe 22, #2). Telling it needs the model's files, so it is checked where the group's model is here
(:func:`~bench.store.carried_checks.group_model_dir`), by every reader of a store (:func:`check_own_artifacts`).
"""

from __future__ import annotations

from pathlib import Path

from presses.registry import PRESSES
from pretrained.fingerprints import files_fingerprint
from runtime.errors import UsageError

from .carried_checks import group_model_dir


def check_own_artifacts(stores: list) -> None:
    """``UsageError`` naming, by file and line, the first row whose press label shows an artifact option at the
    fingerprint of its model's own files, with the label this bench writes of that setting."""
    answers: dict[tuple, str | None] = {}
    own: dict[tuple, str] = {}
    for store in stores:
        for row, line in zip(store.rows, store.line_numbers):
            press = row.get("press")
            if not isinstance(press, str) or "(" not in press:
                continue
            key = (row.get("model"), row.get("weights"), press)
            if key not in answers:
                answers[key] = _problem(press, {"model": row.get("model"), "weights": row.get("weights")}, own)
            if answers[key] is not None:
                raise UsageError(f"{store.path}:{line}: press: {answers[key]} (expected a label as this bench writes "
                                 "it: rerun that method into a store of its own, or move its rows out)")


def _problem(label: str, group: dict, own: dict[tuple, str]) -> str | None:
    """Why ``label``, a press's of a row of ``group``'s model, names that model's own artifact, or None; ``own``
    keeps each model folder's fingerprints as they are computed."""
    name, _, body = label.partition("(")
    files = getattr(PRESSES.get(name), "artifact_files", {})
    pairs = [pair.partition("=")[::2] for pair in body[:-1].split(",")]
    named = [(key, value) for key, value in pairs if key in files]
    if not named:
        return None
    directory = group_model_dir(group)
    if directory is None:  # the model is not here: its files' fingerprint is unknown
        return None
    for key, value in named:
        folder, patterns = files[key]
        place = (str(directory), key)
        if place not in own:
            own[place] = files_fingerprint(Path(directory) / folder, patterns)
        if value == own[place]:
            rest = [f"{k}={v}" for k, v in pairs if k != key]
            shown = f"{name}({','.join(rest)})" if rest else name
            return (f"the label {label!r} names {group['model']}'s own {key} (its files' fingerprint {value}), which "
                    f"a run reads when not told and leaves out of its label: this bench shows that setting as "
                    f"{shown!r}, so its rows name no method a rerun here could match")
    return None

"""Label shards on disk: one safetensors file per labelling window (``<corpus>--<doc>.safetensors``, written by
:func:`gatesight_learning.record.record_corpus`), the settings each records, and reading them back.

A shard holds ``signals.<recurrent layer>`` ``[n, Hv, 3]`` (float16), ``labels.<attention layer>`` and (unless
labelled with ``--futures labels``) ``reconstruction.<attention layer>`` ``[H_kv, n]`` (max-normalised), for the n
context tokens after the chat prefix, with ``scale.<kind>.<attention layer>`` ``[H_kv]`` the normaliser of each (label
kind, KV head) — the raw utility's maximum, so that the raw utilities (one scale across layers: a change of the
residual stream) are label × scale; metadata: corpus, document, checks, weights (fingerprint of the model that
produced them), settings (:func:`label_settings`, JSON: the dtype the model computed in among them), seconds. Shards
of other weights or settings than a resumed run's are refused, and so is a label directory that mixes them when it is
read (:func:`check_shards`), and a shard that cannot be read is named as damaged.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from artifacts.output_kinds import LABEL_SHARDS
from runtime.errors import UsageError, check_regular_file

FUTURES = ("labels", "reconstruction")
"""The label kinds of a shard: sampled continuations (the paper's), the reconstruction future."""

SHARD_FILES = LABEL_SHARDS.files[0]
"""The names of label shards, ``<corpus>--<doc>.safetensors`` (one per window,
:func:`~gatesight_learning.record.record_corpus` writes them): what readers glob, so that no other safetensors file
beside them (a delta's ``mixers.safetensors``) is read as one."""


def _settings_text(settings: dict | None, keys) -> str:
    """``settings`` as ``key=value``, over ``keys`` (those of both sides compared: one not recorded says so)."""
    if settings is None:
        return "settings not recorded: labelled before shards recorded them"
    return ", ".join(f"{k}={settings[k]}" if k in settings else f"{k} not recorded" for k in keys)


def labelled_futures(futures: str) -> tuple[str, ...]:
    """The label kinds ``bench label --futures`` stores: ``both`` (:data:`FUTURES`) or ``labels`` alone."""
    if futures not in ("both", "labels"):
        raise UsageError(f"futures={futures!r}: label both futures or the sampled ones alone (labels)")
    return FUTURES if futures == "both" else ("labels",)


def label_settings(weights: str, tokens: int, continuations: int, max_new_tokens: int, seed: int,
                   futures: str = "both", dtype: str = "float32") -> dict:
    """What a shard labelled with these records (:func:`shard_settings` reads it back): the weights' fingerprint,
    and what its labels depend on besides them: the window's length, the number, length and seed of the sampled
    continuations, the futures labelled (``bench label``'s flags of the same names), and the dtype the model
    computed in (``--dtype``: bfloat16 samples other continuations and rounds the utilities otherwise)."""
    labelled_futures(futures)
    for flag, value, least in (("--tokens", tokens, 1), ("--continuations", continuations, 1),
                               ("--max-new-tokens", max_new_tokens, 2)):
        if value < least:
            raise UsageError(f"{flag} {value}: give at least {least} (a window of at least 1 token, at least 1 "
                             "continuation of at least 2 tokens)")
    return {"weights": weights, "settings": {"tokens": tokens, "continuations": continuations,
                                             "max_new_tokens": max_new_tokens, "seed": seed, "futures": futures,
                                             "dtype": dtype}}


@contextmanager
def _open_shard(path: Path):
    """``safe_open`` of a label shard; one that cannot be read (cut short, overwritten) is a
    :class:`~runtime.errors.UsageError` naming it as damaged."""
    check_regular_file(path, "a label shard")
    try:
        with safe_open(str(path), "pt") as f:
            yield f
    except (SafetensorError, OSError) as error:
        reason = " ".join(str(error).split())
        raise UsageError(f"{path}: a damaged label shard ({reason}); delete it and label again into the same --out "
                         "(`bench label` labels the windows it lacks)") from None


def shard_settings(path: Path) -> dict:
    """``{"weights": fingerprint, "settings": {setting: value} or None}``: what a shard was labelled with
    (:func:`label_settings`; None for a shard written before shards recorded them)."""
    with _open_shard(path) as f:
        meta = f.metadata() or {}
        reconstruction = any(key.startswith("reconstruction.") for key in f.keys())
    settings = json.loads(meta["settings"]) if "settings" in meta else None
    if settings is not None:  # shards written before --futures record it by what they hold
        settings.setdefault("futures", "both" if reconstruction else "labels")
    return {"weights": meta.get("weights", "unknown"), "settings": settings}


def check_shards(paths: list[Path], expected: dict | None = None) -> None:
    """``ValueError`` naming the first shard of ``paths`` labelled with other weights or settings
    (:func:`shard_settings`) than ``expected`` (a resumed ``bench label``), or than the first shard (a label
    directory read for training): labels of different settings are never mixed."""
    if not paths:
        return
    reference, origin = (expected, "this run") if expected is not None else (shard_settings(paths[0]), paths[0])
    fix = ("label into a new --out directory" if expected is not None
           else "keep one setting's shards per directory (label each into its own --out)")
    for path in paths:
        recorded = shard_settings(path)
        differ = []
        if recorded["weights"] != reference["weights"]:
            differ.append(f"other model weights ({recorded['weights']}; {origin}: {reference['weights']})")
        if recorded["settings"] != reference["settings"]:
            keys = list(dict.fromkeys([*(reference["settings"] or {}), *(recorded["settings"] or {})]))
            differ.append(f"other settings ({_settings_text(recorded['settings'], keys)}; {origin}: "
                          f"{_settings_text(reference['settings'], keys)})")
        if differ:
            raise UsageError(f"{path} was labelled with {' and '.join(differ)}; {fix}")


def load_shard(path: Path, futures: str = "labels") -> dict:
    """``{"corpus", "document", "seconds", "signals": {layer: [n, Hv, 3] float32}, "labels": {layer: [H_kv, n]},
    "utilities": {layer: [H_kv, n]} or None}``.

    ``futures`` chooses what ``labels`` holds: ``labels`` (the paper's sampled continuations), ``reconstruction``,
    or ``both`` (their element-wise maximum: an entry is useful if either future needs it). Shards written before
    the reconstruction future have only ``labels``. ``utilities`` are the same futures' raw utilities (label ×
    scale; for ``both`` the maximum of the two raw ones), on one scale across layers and heads; None for shards
    written before they recorded their scales.
    """
    if futures not in FUTURES + ("both",):
        raise UsageError(f"futures={futures!r}: choose {', '.join(FUTURES)} or both")
    with _open_shard(path) as f:
        meta = f.metadata() or {}
        signals = {int(k.split(".")[1]): f.get_tensor(k).float() for k in f.keys() if k.startswith("signals.")}
        kinds = {kind: {int(k.split(".")[1]): f.get_tensor(k) for k in f.keys() if k.startswith(kind + ".")}
                 for kind in FUTURES}
        scales = {kind: {int(k.split(".")[2]): f.get_tensor(k) for k in f.keys() if k.startswith(f"scale.{kind}.")}
                  for kind in FUTURES}
    if "corpus" not in meta or "document" not in meta or not kinds["labels"]:
        raise UsageError(f"{path}: not a label shard (no corpus, document or labels recorded in it); keep only "
                         "`bench label`'s shards in a label directory")
    if not signals:
        raise UsageError(f"{path} holds no recurrent-layer signals: it was labelled on a model without recurrent "
                         "layers, and GateSight learns from them; label a hybrid model")
    if futures != "labels" and not kinds["reconstruction"]:
        raise UsageError(f"{path} has no reconstruction labels (labelled before they existed): label again into a "
                         "new --out directory, or train with --futures labels")
    labels = kinds[futures] if futures != "both" else {
        layer: torch.maximum(u, kinds["reconstruction"][layer]) for layer, u in kinds["labels"].items()}
    chosen = FUTURES if futures == "both" else (futures,)
    utilities = None
    if all(set(scales[kind]) == set(kinds[kind]) for kind in chosen):
        raw = [{layer: u * scales[kind][layer][:, None] for layer, u in kinds[kind].items()} for kind in chosen]
        utilities = {layer: torch.stack([r[layer] for r in raw]).amax(0) for layer in raw[0]}
    return {"corpus": meta["corpus"], "document": meta["document"], "seconds": float(meta.get("seconds", "nan")),
            "signals": signals, "labels": labels, "utilities": utilities}

"""What a press's artifact files must hold, checked where they are read: a GateSight estimator
(``gatesight.json`` and ``gatesight.safetensors``) and a TriAttention calibration (``calibration.safetensors``), by
their loaders, whether the file is a model directory's own or one an option names (``gatesight[estimator=DIR]``,
``triattention[calibration=DIR]``).

Each problem is one :class:`~runtime.errors.UsageError` naming the file and what is wrong, before any context is
scored: a file that reads whole (:func:`pretrained.model_files.check_artifact`) may still hold a layer the model lacks,
a tensor of another shape, a NaN or a setting out of range, which failed deep in scoring (a ``KeyError``, a shape
mismatch) or — a negative window — not at all.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from runtime.errors import UsageError
from runtime.json_text import parse_json

ESTIMATOR_TENSORS = ("mean", "std", "w1", "b1", "w2", "b2")
"""Each attention layer's tensors in an estimator: input standardisation, then the per-head MLP."""
CALIBRATION_TENSORS = ("centre_real", "centre_imag", "magnitude")
"""Each attention layer's tensors in a calibration: the band centres (complex, as two parts) and magnitudes."""
REWRITE_ESTIMATOR = "train it again with `bench train` (or restore the file)"
REWRITE_CALIBRATION = "measure it again with `bench calibrate --model MODEL --replace` (or restore the file)"


def _layer(text: str, path: Path, what: str, redo: str) -> int:
    """``text`` as a layer index (digits), else a refusal naming ``what`` holds it."""
    if not (isinstance(text, str) and text.isdigit() and text.isascii()):
        raise UsageError(f"{path}: {what} {text!r} is not a layer index (digits); {redo}")
    return int(text)


MAGNITUDE_LIMIT = 1e6
"""The largest magnitude an artifact's tensor may hold (and the inverse of the smallest standard deviation): a
trained estimator's statistics and weights and a calibration's query statistics are of the activations' scale (the
shipped ones stay under 16); past this a finite value overflows float32 in scoring (3.4e38 gave infinite scores
after the prefill)."""


def checked_values(path: Path, name: str, tensor: torch.Tensor, redo: str) -> torch.Tensor:
    """``tensor`` (``name`` in ``path``) in float32, the precision it is scored in (an estimator saved in float16 met
    float32 features in a matrix product); a refusal naming it if it holds no real numbers, a NaN, an infinity or a
    value of magnitude past :data:`MAGNITUDE_LIMIT`."""
    if not tensor.is_floating_point():
        raise UsageError(f"{path}: tensor {name} is of {str(tensor.dtype).removeprefix('torch.')}, not of real "
                         f"numbers; {redo}")
    tensor = tensor.float()
    if not bool(torch.isfinite(tensor).all()):
        raise UsageError(f"{path}: tensor {name} holds NaN or infinite values; {redo}")
    largest = float(tensor.abs().max()) if tensor.numel() else 0.0
    if largest > MAGNITUDE_LIMIT:
        raise UsageError(f"{path}: tensor {name} holds a value of magnitude {largest:.3g}, past {MAGNITUDE_LIMIT:g} "
                         f"(no trained artifact's scale: it overflows in scoring); {redo}")
    return tensor


def estimator_settings(config, path: Path) -> tuple[int, dict[int, list[int]]]:
    """The window and the signal layers of each attention layer that ``config`` (``gatesight.json`` as parsed)
    holds, checked: an integer window >= 1, and each attention layer's signal layers a list of at most that many
    distinct layer indices."""
    redo = REWRITE_ESTIMATOR
    if not (isinstance(config, dict) and isinstance(config.get("gdn_layers"), dict)):
        raise UsageError(f"{path}: not a GateSight estimator's settings (expected an object with an integer window "
                         f"and gdn_layers); {redo}")
    window = config.get("window")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise UsageError(f"{path}: window={window!r}, expected an integer >= 1 (how many signal layers precede an "
                         f"attention layer's features); {redo}")
    gdn_layers = {}
    for key, layers in config["gdn_layers"].items():
        # training writes the signal layers once each in depth order (presses.gatesight.gdn_window): a repeated or
        # reordered index feeds the MLPs features of another meaning, with plausible but wrong scores (probes 8, 9)
        if not (isinstance(layers, list) and len(layers) <= window and all(
                isinstance(j, int) and not isinstance(j, bool) and j >= 0 for j in layers)
                and layers == sorted(set(layers))):
            raise UsageError(f"{path}: gdn_layers[{key!r}]={layers!r}, expected a list of at most window={window} "
                             f"distinct GDN layer indices >= 0 in depth order (ascending); {redo}")
        gdn_layers[_layer(key, path, "gdn_layers key", redo)] = layers
    if not isinstance(config.get("meta", {}), dict):
        raise UsageError(f"{path}: meta={config['meta']!r}, expected an object (the training record); {redo}")
    return window, gdn_layers


def estimator_layers(tensors: dict[str, torch.Tensor], gdn_layers: dict[int, list[int]],
                     path: Path) -> dict[int, dict[str, torch.Tensor]]:
    """``gatesight.safetensors``'s tensors (``<layer>.<name>``) by layer, checked: the layers ``gdn_layers`` names
    and no other, each with every tensor of :data:`ESTIMATOR_TENSORS` in shapes that agree (``w1`` ``[H, F, K]``,
    ``mean`` and ``std`` ``[F]``, ``b1`` and ``w2`` ``[H, K]``, ``b2`` ``[H]``), finite and within
    :data:`MAGNITUDE_LIMIT`, ``std`` >= its inverse."""
    redo = REWRITE_ESTIMATOR
    layers: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        layer, _, key = name.partition(".")
        if key not in ESTIMATOR_TENSORS:
            raise UsageError(f"{path}: tensor {name!r} is none of an estimator's (<layer>.<"
                             f"{'|'.join(ESTIMATOR_TENSORS)}>); {redo}")
        layers.setdefault(_layer(layer, path, "tensor layer", redo), {})[key] = checked_values(path, name, tensor, redo)
    if set(layers) != set(gdn_layers):
        raise UsageError(f"{path}: its tensors are of layers {sorted(layers)}, its gatesight.json names layers "
                         f"{sorted(gdn_layers)}; the two files are of one estimator: {redo}")
    for layer, held in sorted(layers.items()):
        missing = [key for key in ESTIMATOR_TENSORS if key not in held]
        if missing:
            raise UsageError(f"{path}: layer {layer} has no tensor {', '.join(f'{layer}.{k}' for k in missing)}; "
                             f"{redo}")
        if held["w1"].dim() != 3:
            raise UsageError(f"{path}: tensor {layer}.w1 is {list(held['w1'].shape)}, expected [heads, features, "
                             f"hidden]; {redo}")
        heads, features, hidden = held["w1"].shape
        expected = {"mean": [features], "std": [features], "b1": [heads, hidden], "w2": [heads, hidden],
                    "b2": [heads]}
        for key, shape in expected.items():
            if list(held[key].shape) != shape:
                raise UsageError(f"{path}: tensor {layer}.{key} is {list(held[key].shape)}, expected {shape} (as "
                                 f"{layer}.w1 is {list(held['w1'].shape)}); {redo}")
        if not bool((held["std"] >= 1 / MAGNITUDE_LIMIT).all()):
            raise UsageError(f"{path}: tensor {layer}.std holds a value below {1 / MAGNITUDE_LIMIT:g} (a standard "
                             f"deviation: features divided by it overflow); {redo}")
    return layers


def check_estimator_geometry(layers: dict[int, dict[str, torch.Tensor]], gdn_layers: dict[int, list[int]],
                             adapter, features_of, shown: str) -> None:
    """A refusal naming ``shown`` (the estimator's file) where it does not fit ``adapter``'s model: an attention
    layer without its MLPs, signal layers the model lacks (or after the layer), another number of KV heads, or
    another number of features than its signal layers give (``features_of(signal layers)``)."""
    redo = REWRITE_ESTIMATOR + " on this model"
    missing = sorted(set(adapter.attention_layers) - set(layers))
    if missing:
        raise UsageError(f"{shown}: no MLPs for attention layers {missing} of this model; {redo}")
    signal = set(adapter.signal_layers)
    for layer in adapter.attention_layers:
        other = [j for j in gdn_layers[layer] if j not in signal or j > layer]
        if other:
            raise UsageError(f"{shown}: attention layer {layer} reads signal layers {other}, which this model does "
                             f"not have before it (its signal layers: {sorted(signal)}); {redo}")
        heads, features, _ = layers[layer]["w1"].shape
        if heads != adapter.geometry.num_kv_heads:
            raise UsageError(f"{shown}: layer {layer} has MLPs for {heads} KV heads, this model has "
                             f"{adapter.geometry.num_kv_heads}; {redo}")
        wanted = features_of(gdn_layers[layer])
        if features != wanted:
            raise UsageError(f"{shown}: layer {layer} takes {features} features, this model's signals give "
                             f"{wanted}; {redo}")


def calibration_contents(meta, tensors: dict[str, torch.Tensor], path: Path) -> dict:
    """The contents of ``calibration.safetensors`` (``meta``: its metadata, ``tensors``: its tensors), checked:
    metadata holding ``gate_weights`` (a JSON object of each layer's weight in [0, 1]), ``tokens`` (an integer
    >= 1) and ``sources`` (a JSON list of texts); for every layer the gate weights name, each tensor of
    :data:`CALIBRATION_TENSORS`, of one 2-D shape ``[heads, bands]``, finite and within :data:`MAGNITUDE_LIMIT`,
    magnitudes >= 0, and no other.
    Returns ``{"layers": {layer: {name: tensor}}, "gate_weights": {layer: w}, "tokens": int, "sources": list}``."""
    redo = REWRITE_CALIBRATION
    if not isinstance(meta, dict):
        raise UsageError(f"{path}: holds no metadata (gate_weights, tokens, sources); {redo}")
    fields = {}
    for key in ("gate_weights", "tokens", "sources"):
        try:
            fields[key] = parse_json(meta[key])
        except KeyError:
            raise UsageError(f"{path}: its metadata has no {key}; {redo}") from None
        except json.JSONDecodeError as error:
            raise UsageError(f"{path}: its metadata {key} is not JSON ({error}); {redo}") from None
    weights, tokens, sources = fields["gate_weights"], fields["tokens"], fields["sources"]
    if not isinstance(weights, dict) or not all(
            isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) and 0 <= w <= 1
            for w in weights.values()):
        raise UsageError(f"{path}: its metadata gate_weights={meta['gate_weights']!r}, expected an object of each "
                         f"layer's weight in [0, 1]; {redo}")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise UsageError(f"{path}: its metadata tokens={meta['tokens']!r}, expected an integer >= 1; {redo}")
    if not (isinstance(sources, list) and all(isinstance(s, str) for s in sources)):
        raise UsageError(f"{path}: its metadata sources={meta['sources']!r}, expected a list of texts; {redo}")
    gate_weights = {_layer(k, path, "gate_weights key", redo): float(w) for k, w in weights.items()}
    layers: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        key, _, layer = name.partition(".")
        if key not in CALIBRATION_TENSORS:
            raise UsageError(f"{path}: tensor {name!r} is none of a calibration's (<{'|'.join(CALIBRATION_TENSORS)}>"
                             f".<layer>); {redo}")
        layers.setdefault(_layer(layer, path, "tensor layer", redo), {})[key] = checked_values(path, name, tensor, redo)
    for layer in sorted(set(layers) | set(gate_weights)):
        held = layers.get(layer, {})
        missing = [f"{key}.{layer}" for key in CALIBRATION_TENSORS if key not in held]
        if missing or layer not in gate_weights:
            lacks = f"tensor {', '.join(missing)}" if missing else "gate weight"
            raise UsageError(f"{path}: layer {layer} has no {lacks}; {redo}")
        shapes = {key: list(tensor.shape) for key, tensor in held.items()}
        if len(set(map(tuple, shapes.values()))) != 1 or held["magnitude"].dim() != 2:
            raise UsageError(f"{path}: layer {layer}'s tensors are {shapes}, expected one shape [heads, bands]; "
                             f"{redo}")
        if not bool((held["magnitude"] >= 0).all()):
            raise UsageError(f"{path}: tensor magnitude.{layer} holds a value < 0 (a mean magnitude); {redo}")
        if not bool((held["magnitude"] > 0).any()):  # a layer whose queries were never measured scores every key 0
            raise UsageError(f"{path}: tensor magnitude.{layer} is 0 everywhere, which no measured calibration is; "
                             f"{redo}")
    return {"layers": layers, "gate_weights": gate_weights, "tokens": tokens, "sources": sources}


def check_calibration_geometry(layers: dict[int, torch.Tensor], adapter, shown: str) -> None:
    """A refusal naming ``shown`` (the calibration's file) where its layers (``layers``: each layer's magnitudes)
    are not ``adapter``'s attention layers, or a layer's shape is not ``[query heads, head_dim / 2]``."""
    redo = REWRITE_CALIBRATION.replace("MODEL", str(adapter.model_dir or "MODEL"))
    if set(layers) != set(adapter.attention_layers):
        raise UsageError(f"{shown}: its layers are {sorted(layers)}, this model's attention layers are "
                         f"{sorted(adapter.attention_layers)}; {redo}")
    g = adapter.geometry
    wanted = [g.num_heads, g.head_dim // 2]
    for layer, tensor in sorted(layers.items()):
        if list(tensor.shape) != wanted:
            raise UsageError(f"{shown}: layer {layer}'s tensors are {list(tensor.shape)}, this model's are {wanted} "
                             f"(query heads, bands); {redo}")

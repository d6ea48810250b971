"""Offline per-model statistics measured once on generic text (``bench calibrate``) and stored with the model.

- TriAttention query statistics: per attention layer and query head, the complex band centres μ_f and mean
  magnitudes A_f of the pre-RoPE (post-norm) queries; rotated bands pair dims (i, i + r/2) as RoPE does, NoPE
  dims pair (r + i, r + i + (d − r)/2) and act as zero-frequency bands.
- Gate weights (paper §4.2): per attention layer, the mean over KV heads of the max over that head's query heads
  of the token-mean sigmoid output gate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from allocators import HeadShares
from pretrained.fingerprints import weights_fingerprint
from pretrained.model_info import ModelInfo, model_of
from runtime.adapters import ModelAdapter, adapter_for
from runtime.errors import UsageError, check_regular_file
from runtime.forward import SequenceState, forward_chunk

from .artifact_contents import calibration_contents, check_calibration_geometry

FILE = Path("calibration") / "calibration.safetensors"
"""Where a model directory holds its calibration: in a subfolder, because engines such as vLLM load every
``*.safetensors`` at a model directory's root as a weight shard."""
LEGACY_FILE = "calibration.safetensors"  # the root location written before; still read


def calibration_path(directory) -> Path:
    """The calibration file of a model directory: :data:`FILE`, or the root file older versions wrote."""
    legacy = Path(directory) / LEGACY_FILE
    return legacy if legacy.exists() and not (Path(directory) / FILE).exists() else Path(directory) / FILE


def query_bands(query: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """``[..., d]`` real vectors -> ``[..., d/2]`` complex bands: rotated pairs first, then NoPE pairs."""
    half, rest = rotary_dim // 2, (query.shape[-1] - rotary_dim) // 2
    rot = torch.complex(query[..., :half].float(), query[..., half:rotary_dim].float())
    nope = torch.complex(query[..., rotary_dim : rotary_dim + rest].float(), query[..., rotary_dim + rest :].float())
    return torch.cat([rot, nope], dim=-1)


def band_frequencies(adapter: ModelAdapter) -> torch.Tensor:
    """``[d/2]`` angular frequency of each band (0 for NoPE bands)."""
    g = adapter.geometry
    positions = torch.tensor([0, 1], device=adapter.device)
    cos, sin = adapter.rope(torch.zeros(1, dtype=torch.float32, device=adapter.device), positions)
    omega = torch.atan2(sin[1, : g.rotary_dim // 2].float(), cos[1, : g.rotary_dim // 2].float())
    return torch.cat([omega, omega.new_zeros(g.head_dim // 2 - g.rotary_dim // 2)])


@dataclass
class Calibration:
    """Attributes: ``centres`` / ``magnitudes`` ``{layer: [H, d/2]}`` (complex / real), ``gate_weights`` ``{layer: w}``,
    ``tokens``: how many calibration tokens were read, ``sources``: what text, ``weights``: the fingerprint of the
    model weights it was measured on (:func:`weights_fingerprint`; None for a model built in memory, and for a
    calibration saved before calibrations recorded it)."""

    centres: dict[int, torch.Tensor]
    magnitudes: dict[int, torch.Tensor]
    gate_weights: dict[int, float]
    tokens: int
    sources: list[str]
    weights: str | None = None
    path: Path | None = field(default=None, compare=False)
    """The file it was read from (:meth:`load`), as refusals name it; None for one measured in memory."""

    def save(self, directory: Path) -> Path:
        tensors = {}
        for layer in self.centres:
            tensors[f"centre_real.{layer}"] = self.centres[layer].real.contiguous()
            tensors[f"centre_imag.{layer}"] = self.centres[layer].imag.contiguous()
            tensors[f"magnitude.{layer}"] = self.magnitudes[layer].contiguous()
        meta = {"gate_weights": json.dumps({str(k): v for k, v in self.gate_weights.items()}),
                "tokens": str(self.tokens), "sources": json.dumps(self.sources),
                **({"weights": self.weights} if self.weights is not None else {})}
        path = Path(directory) / FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(path), metadata=meta)
        return path

    @classmethod
    def load(cls, directory) -> "Calibration":
        path = calibration_path(directory)
        check_regular_file(path, "a calibration (safetensors)")
        if not path.exists():
            raise FileNotFoundError(
                f"no calibration at {path}: run `bench calibrate --model {directory}` (one pass over generic text)"
            )
        with safe_open(str(path), "pt") as f:
            meta = f.metadata()
        held = calibration_contents(meta, load_file(str(path)), path)
        layers = held["layers"]
        return cls(
            centres={layer: torch.complex(t["centre_real"], t["centre_imag"]) for layer, t in layers.items()},
            magnitudes={layer: t["magnitude"] for layer, t in layers.items()},
            gate_weights=held["gate_weights"],
            tokens=held["tokens"],
            sources=held["sources"],
            weights=meta.get("weights"),
            path=path,
        )

    def check_model(self, adapter: ModelAdapter) -> None:
        """A :class:`~runtime.errors.UsageError` naming its file where its layers or shapes are not ``adapter``'s
        model's (:func:`~presses.artifact_contents.check_calibration_geometry`)."""
        check_calibration_geometry(self.magnitudes, adapter, "the Calibration given" if self.path is None
                                   else str(self.path))

    @staticmethod
    def exists(directory) -> bool:
        return calibration_path(directory).exists()

    @classmethod
    def for_model(cls, adapter: ModelAdapter, model: ModelInfo | None = None) -> "Calibration":
        """The calibration of ``adapter``'s model directory, checked against its weights; ``model``: that model as
        read once (:class:`~pretrained.model_info.ModelInfo`), or None to read it from the adapter's directory."""
        if adapter.model_dir is None:
            raise ValueError(
                "the model was not loaded from a local directory, so its calibration cannot be found: "
                "pass the layer weights explicitly or run `bench calibrate --model PATH`"
            )
        model = model or model_of(adapter)
        calibration = cls.load(model.directory)
        calibration.check_model(adapter)
        calibration.check_weights(model, f"the calibration in {model.directory}")
        return calibration

    def check_weights(self, model: ModelInfo, shown: str) -> None:
        """``ValueError`` if this calibration (``shown``: it, as the message names it) records the weights it was
        measured on and ``model``'s weight files are others: its query statistics and gate weights are another
        model's. One that records none (saved before calibrations did), or a directory without weight files, passes.
        """
        here = model.weights
        if self.weights is None or here is None or self.weights == here:
            return
        raise ValueError(f"{shown} was measured on model weights {self.weights}, not this "
                         f"model's ({here}): run `bench calibrate --model {model.directory}` to measure this model's")


def head_shares_for(adapter: ModelAdapter, model: ModelInfo | None = None) -> HeadShares:
    """The head shares of ``adapter``'s model directory (:data:`allocators.head_shares.FILE`), checked against its
    attention layers, KV heads and weights (``model``: that model as read once, or None to read it from the
    adapter's directory); a one-line ``UsageError`` if they are missing, damaged or another model's."""
    if adapter.model_dir is None:
        raise UsageError("the model was not loaded from a local directory, so its head shares cannot be found: "
                         "load it from one that holds calibration/head_shares.json")
    shares = HeadShares.load(adapter.model_dir)
    shown = f"the head shares in {adapter.model_dir}"
    shares.check(tuple(adapter.attention_layers), adapter.geometry.num_kv_heads, shown)
    here = (model or model_of(adapter)).weights
    if shares.weights is not None and here is not None and shares.weights != here:
        raise UsageError(f"{shown} were measured on model weights {shares.weights}, not this model's ({here}): run "
                         f"`bench calibrate-shares --model {adapter.model_dir} --replace`")
    return shares


class _Statistics:
    """Forward observer accumulating band sums of pre-RoPE queries and token sums of the sigmoid gate."""

    wants_recurrent_signals = False

    def __init__(self, adapter: ModelAdapter):
        self.adapter = adapter
        self.band_sum: dict[int, torch.Tensor] = {}
        self.magnitude_sum: dict[int, torch.Tensor] = {}
        self.gate_sum: dict[int, torch.Tensor] = {}

    def on_attention(self, layer, hidden, query, gate, keys, values, output):
        pre_rope, _ = self.adapter.project_query(layer, hidden)
        bands = query_bands(pre_rope, self.adapter.geometry.rotary_dim)  # [H, L, d/2]
        self.band_sum[layer] = self.band_sum.get(layer, 0) + bands.sum(1)
        self.magnitude_sum[layer] = self.magnitude_sum.get(layer, 0) + bands.abs().sum(1)
        if gate is not None:
            self.gate_sum[layer] = self.gate_sum.get(layer, 0) + torch.sigmoid(gate.float()).mean(-1).sum(0)


@torch.no_grad()
def calibrate(model, token_chunks: list[torch.Tensor], sources: list[str], progress=None) -> Calibration:
    """Measure query statistics and gate weights over ``token_chunks``, each run as its own sequence."""
    adapter = adapter_for(model)
    stats = _Statistics(adapter)
    tokens = 0
    for chunk in token_chunks:
        forward_chunk(adapter, SequenceState(), chunk, stats)
        tokens += chunk.numel()
        if progress:
            progress(chunk.numel())
    g = adapter.geometry
    gate_weights = {}
    for layer in adapter.attention_layers:
        if layer in stats.gate_sum:
            per_head = (stats.gate_sum[layer] / tokens).view(g.num_kv_heads, g.group_size)
            gate_weights[layer] = float(per_head.amax(1).mean())
        else:
            gate_weights[layer] = 1.0  # ungated (dense) model: the gate allocator degenerates to flat
    return Calibration(
        centres={layer: stats.band_sum[layer] / tokens for layer in adapter.attention_layers},
        magnitudes={layer: stats.magnitude_sum[layer] / tokens for layer in adapter.attention_layers},
        gate_weights=gate_weights,
        tokens=tokens,
        sources=sources,
        weights=weights_fingerprint(adapter.model_dir),
    )

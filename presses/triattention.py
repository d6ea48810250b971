"""TriAttention (arXiv 2604.04921; official code ``WeianMao/triattention``): trigonometric key scoring.

With the calibrated centre query μ (complex bands) of a query head, the expected logit of that query at a future
position t + δ against cached key j is ``P_j = Re Σ_f μ_f e^{iω_f(t+δ)} conj(z̃_jf)`` (z̃: bands of the post-RoPE
key), which equals ``Σ_f |μ_f||z_jf| cos(ω_f Δ + φ_jf)`` with Δ = t + δ − p_j. The score is the mean over geometric
offsets δ ∈ {1, 2, 4, …, 2^16} plus the norm term ``Σ_f (A_f − |μ_f|)|z_jf|``; z-scored per query head, then the
max over the GQA group. The mean over δ is linear, so it folds into one complex coefficient per band.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from artifacts.outputs import MODEL_CONFIG
from pretrained import loading
from pretrained.model_info import ModelInfo
from runtime.errors import UsageError, check_regular_file, not_a_directory

from .base import Press, Scores, ScoringContext, group_reduce
from .calibration import FILE, LEGACY_FILE, Calibration, band_frequencies, calibration_path, query_bands


def geometric_offsets(max_offset: int = 65536) -> torch.Tensor:
    return 2.0 ** torch.arange(0, int(torch.log2(torch.tensor(float(max_offset)))) + 1)


def trig_preference(centre: torch.Tensor, key_bands: torch.Tensor, omega: torch.Tensor, query_positions: torch.Tensor):
    """Expected logit of the centre query at each query position against each key (scale not applied).

    Parameters
    ----------
    centre : torch.Tensor
        ``[H, F]`` complex band centres.
    key_bands : torch.Tensor
        ``[H, n, F]`` complex bands of the post-RoPE keys.
    omega : torch.Tensor
        ``[F]`` band frequencies.
    query_positions : torch.Tensor
        ``[D]`` positions; the result is averaged over them.

    Returns
    -------
    torch.Tensor
        ``[H, n]``.
    """
    # float64 phases: at positions ~1e5 a float32 angle is off by ~1e-2 rad
    angles = omega.double()[None] * query_positions.double()[:, None]
    phase = torch.polar(torch.ones_like(angles), angles).mean(0).to(centre.dtype)  # [F]
    coefficient = centre * phase  # [H, F]
    return torch.einsum("hnf,hf->hn", key_bands.conj(), coefficient).real


def _calibration_advice(directory: Path) -> str:
    """How to get a calibration where ``calibration=directory`` found none: ``bench calibrate`` measures one for a
    model and writes it into that model's directory, so it is the advice only where ``directory`` is a model's."""
    if (directory / MODEL_CONFIG).is_file():
        return f"run `bench calibrate --model {directory}`"
    return ("it is not a model directory either: name the directory of a model that `bench calibrate --model DIR` "
            "has calibrated, or leave the option out (the run's model's own calibration is read from its directory; "
            "`bench calibrate --model MODEL` writes it)")


@dataclass
class TriAttentionPress(Press):
    """Parameters: ``calibration`` (a :class:`Calibration`, or the model directory holding one, as the CLI's
    ``triattention[calibration=DIR]`` gives it; default: loaded from the model's directory), ``max_offset``, ``gqa``
    ("max")."""

    calibration: Calibration | str | Path | None = None
    max_offset: int = 65536
    gqa: str = "max"
    normalize: bool = True
    name = "triattention"
    runs_in_engine = True
    artifact_files = {"calibration": (".", (FILE.as_posix(), LEGACY_FILE))}

    def __post_init__(self):
        self._source = None  # the directory calibration= named, which a mismatch names
        if self.gqa not in ("mean", "max"):
            raise UsageError(f"gqa={self.gqa!r}: choose 'mean' or 'max'")
        if isinstance(self.max_offset, bool) or not isinstance(self.max_offset, int) or self.max_offset < 1:
            raise UsageError(f"max_offset={self.max_offset!r}: expected an integer >= 1")
        if isinstance(self.calibration, (str, Path)):
            if not str(self.calibration).strip():  # Path('') is '.', the current directory: never meant
                raise UsageError("calibration='' is empty: give the model directory holding a calibration, or leave "
                                 "the option out (a model's own calibration is read from its directory)")
            directory = Path(self.calibration)
            if not directory.is_dir():
                what = not_a_directory(directory)  # a link named with where it leads (/dev/null, nowhere)
                raise UsageError(f"calibration={str(directory)!r}: {what} (give the model directory `bench "
                                 "calibrate --model DIR` wrote its calibration into)")
            try:  # a folder, a pipe or a device in the file's place: named as such, never read
                check_regular_file(calibration_path(directory), "the calibration's file")
            except UsageError as error:
                raise UsageError(f"calibration={str(directory)!r}: {error}") from None
            if not Calibration.exists(directory):
                raise UsageError(f"calibration={str(directory)!r}: no calibration there (no {directory / FILE}); "
                                 + _calibration_advice(directory))
            try:  # the checks a model directory's own calibration gets (pretrained.loading.check_artifacts)
                loading.check_artifact(calibration_path(directory))
            except UsageError as error:
                raise UsageError(f"calibration={str(directory)!r}: {error}") from None
            self.calibration, self._source = Calibration.load(directory), directory
        elif self.calibration is not None and not isinstance(self.calibration, Calibration):
            raise UsageError(f"calibration={self.calibration!r}: give a Calibration or the model directory holding "
                             "one")

    def bind(self, model: ModelInfo | None) -> None:
        """Load the model's own calibration where none was given; refuse (``ValueError``) a calibration measured on
        other model weights than ``model``'s: its query statistics are another model's."""
        given = self.calibration is not None
        if not given and model is not None and Calibration.exists(model.directory):
            self.calibration = Calibration.load(model.directory)
        if self.calibration is not None and model is not None:
            source = self._source if given else model.directory
            shown = "the Calibration given" if source is None else f"the calibration in {source}"
            self.calibration.check_weights(model, shown)

    def check(self, adapter) -> None:
        if self.calibration is None:
            where = "the model was not loaded from a local directory" if adapter.model_dir is None else (
                f"none was found in {adapter.model_dir}")
            raise ValueError(f"TriAttention needs the model's calibration and {where}: pass calibration= or run "
                             "`bench calibrate --model PATH`")
        self.calibration.check_model(adapter)

    def score(self, context: ScoringContext) -> Scores:
        adapter = context.adapter
        self.check(adapter)
        g = adapter.geometry
        omega = band_frequencies(adapter)
        positions = context.n + geometric_offsets(self.max_offset)
        scores = {}
        for layer in adapter.attention_layers:
            keys = context.kv[layer].keys[:, context.protected :]
            bands = query_bands(keys, g.rotary_dim).repeat_interleave(g.group_size, 0)  # [H, n, F]
            centre = self.calibration.centres[layer].to(keys.device)
            trig = trig_preference(centre, bands, omega, positions.to(keys.device))
            magnitudes = self.calibration.magnitudes[layer].to(keys.device)
            norm_term = bands.abs() @ (magnitudes - centre.abs()).unsqueeze(-1)
            per_head = trig + norm_term[..., 0]
            if self.normalize:
                per_head = (per_head - per_head.mean(-1, keepdim=True)) / per_head.std(-1, keepdim=True).clamp_min(1e-6)
            scores[layer] = group_reduce(per_head, g.group_size, self.gqa)
        return scores

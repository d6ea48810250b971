"""GateSight (paper §4): per-(attention layer, KV head) MLPs read the native GDN signals of prefill and the age
of an entry and predict its future utility. No attention score is computed. On a Mamba2 hybrid they read the Mamba2
layers' analogues (write strength Δ·‖B‖, log-decay A·Δ, ‖x‖; :func:`runtime.mamba2.mamba2_forward`).

The estimator artifact is a directory with ``gatesight.safetensors`` (weights and input statistics) and
``gatesight.json`` (geometry, GDN window, layer gate weights); it lives in ``<model dir>/gatesight/`` and is
trained by ``bench label`` + ``bench train``.

An estimator is on one of two scales (:data:`SCALES`, ``bench train --scale``; :mod:`gatesight_learning.estimator`
says how each is trained): ``head``, the paper's, predicts an entry's utility relative to its own (layer, KV head)'s
largest, so its scores rank entries within a head only; ``one`` predicts the log of the utility relative to one
constant of the document, the same for every layer and head, so its scores can be ranked across layers (the
``global`` allocator).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from pretrained import loading
from pretrained.model_info import ModelInfo
from runtime import EvidenceRequest
from runtime.adapters import ModelAdapter
from runtime.bounded_read import METADATA_LIMIT, read_text_bounded
from runtime.errors import (
    MissingFileError,
    UsageError,
    check_regular_file,
    link_target,
    missing_file,
    not_a_directory,
)
from runtime.json_text import parse_json

from .artifact_contents import check_estimator_geometry, estimator_layers, estimator_settings
from .base import Press, Scores, ScoringContext

ARTIFACT_DIR = "gatesight"
ESTIMATOR_FILES = ("gatesight.json", "gatesight.safetensors")
SIGNALS = ("beta", "g", "vnorm")
SCALES = ("head", "one")
"""What an estimator's predictions are relative to: each (layer, KV head)'s largest utility, or one constant per
document; an estimator saved before estimators recorded it is ``head``."""
AGE_FEATURES = ("i/n", "(n-i)/n", "log(1+n-i)/log(1+n)")


def gdn_window(adapter: ModelAdapter, layer: int, window: int = 6) -> list[int]:
    """The up-to-``window`` signal layers (GDN, or a Mamba2 hybrid's Mamba2 layers) that precede attention layer
    ``layer`` in depth order; a Mamba2 mixer running beside it in the same layer (Falcon-H1) counts, as it reads the
    same input."""
    return [i for i in adapter.signal_layers if i <= layer][-window:]


def feature_names(adapter: ModelAdapter, layer: int, window: int = 6) -> list[str]:
    """Name of every input dimension: ``gdn{j}.h{m}.{signal}`` for each window layer j, value head m, signal;
    then the three age features."""
    heads = adapter.signal_heads()
    return ([f"gdn{j}.h{m}.{s}" for j in gdn_window(adapter, layer, window) for m in range(heads) for s in SIGNALS]
            + list(AGE_FEATURES))


def build_features(signals: dict[int, torch.Tensor], gdn_layers: list[int], n: int, positions: torch.Tensor):
    """``[len(positions), F]`` float32 features of the entries at 0-based ``positions`` of an n-token context.

    ``signals[j]`` is ``[n, Hv, 3]`` (β, g, ‖v‖); entry i (1-based i = position + 1) gets its own token's signals.
    """
    parts = [signals[j][positions].reshape(positions.numel(), -1).float() for j in gdn_layers]
    i = positions.float() + 1
    age = torch.stack([i / n, (n - i) / n, torch.log1p(n - i) / torch.log1p(i.new_tensor(float(n)))], dim=-1)
    return torch.cat(parts + [age], dim=-1)


def init_mlp(heads: int, dims: int, hidden: int, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """Parameters of ``heads`` independent MLPs ``dims -> hidden -> 1``: ``w1`` ``[H, F, hidden]``, ``b1``
    ``[H, hidden]``, ``w2`` ``[H, hidden]``, ``b2`` ``[H]`` (fan-in scaled normal weights, zero biases)."""
    return {
        "w1": torch.randn(heads, dims, hidden, generator=generator) / dims**0.5,
        "b1": torch.zeros(heads, hidden),
        "w2": torch.randn(heads, hidden, generator=generator) / hidden**0.5,
        "b2": torch.zeros(heads),
    }


def mlp_logits(x: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[N, F]`` standardised features -> ``[H, N]`` pre-sigmoid outputs of every head's MLP (one batched pass)."""
    hidden = torch.relu(torch.einsum("nf,hfk->hnk", x, params["w1"]) + params["b1"][:, None])
    return torch.einsum("hnk,hk->hn", hidden, params["w2"]) + params["b2"][:, None]


@dataclass
class GateSightEstimator:
    """One MLP ``F -> hidden -> 1`` (sigmoid) per attention layer and KV head, with input standardisation.

    Attributes
    ----------
    window : int
    layers : dict[int, dict[str, torch.Tensor]]
        Per attention layer: ``mean``/``std`` ``[F]``, ``w1`` ``[H_kv, F, hidden]``, ``b1`` ``[H_kv, hidden]``,
        ``w2`` ``[H_kv, hidden]``, ``b2`` ``[H_kv]``.
    gdn_layers : dict[int, list[int]]
    meta : dict
        Training record (corpus, epochs, metrics); ``meta["scale"]`` is the scale it was trained on (:attr:`scale`),
        ``meta["weights"]`` the fingerprint of the model weights it was trained on (``bench train`` records it).
    directory : Path, optional
        Where it was loaded from (:meth:`load`), as refusals name it; None for one built in memory.
    """

    window: int
    layers: dict[int, dict[str, torch.Tensor]]
    gdn_layers: dict[int, list[int]]
    meta: dict = field(default_factory=dict)
    directory: Path | None = field(default=None, compare=False)

    @classmethod
    def random(cls, adapter: ModelAdapter, hidden: int = 64, window: int = 6, seed: int = 0) -> "GateSightEstimator":
        """A randomly initialised estimator (tests, or the starting point of training)."""
        generator = torch.Generator().manual_seed(seed)
        heads = adapter.geometry.num_kv_heads
        layers, windows = {}, {}
        for layer in adapter.attention_layers:
            windows[layer] = gdn_window(adapter, layer, window)
            dims = len(feature_names(adapter, layer, window))
            layers[layer] = {"mean": torch.zeros(dims), "std": torch.ones(dims),
                             **init_mlp(heads, dims, hidden, generator)}
        return cls(window, layers, windows)

    @property
    def scale(self) -> str:
        """``head`` or ``one`` (:data:`SCALES`): what the predictions are relative to; ``head`` when not recorded."""
        return self.meta.get("scale", "head")

    def logits(self, layer: int, features: torch.Tensor) -> torch.Tensor:
        """``[N, F]`` features -> ``[H_kv, N]`` raw outputs of every KV head's MLP (one batched pass): the logit of
        the max-normalised utility (scale ``head``), or the log of the one-scale utility (scale ``one``)."""
        p = self.layers[layer]
        return mlp_logits((features - p["mean"]) / p["std"], p)

    def utility(self, layer: int, features: torch.Tensor) -> torch.Tensor:
        """``[N, F]`` features -> ``[H_kv, N]`` predicted utilities on the estimator's scale, increasing in
        :meth:`logits`: the sigmoid of them (``head``, in (0, 1) per head), or their exponential (``one``, the
        utility as a fraction of the document's largest, in every layer and head alike)."""
        logits = self.logits(layer, features)
        return torch.exp(logits) if self.scale == "one" else torch.sigmoid(logits)

    def to(self, device) -> "GateSightEstimator":
        """The same estimator with its tensors on ``device`` (itself if they already are)."""
        device = torch.device(device)
        if all(t.device == device for p in self.layers.values() for t in p.values()):
            return self
        layers = {layer: {k: v.to(device) for k, v in p.items()} for layer, p in self.layers.items()}
        return GateSightEstimator(self.window, layers, self.gdn_layers, self.meta, self.directory)

    def save(self, directory) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {f"{layer}.{k}": v.contiguous() for layer, p in self.layers.items() for k, v in p.items()}
        save_file(tensors, str(directory / "gatesight.safetensors"))
        config = {"window": self.window, "gdn_layers": {str(k): v for k, v in self.gdn_layers.items()},
                  "meta": self.meta}
        (directory / "gatesight.json").write_text(json.dumps(config, indent=2))
        return directory

    @classmethod
    def load(cls, directory) -> "GateSightEstimator":
        directory = Path(directory)
        if not (directory / "gatesight.json").exists():
            raise MissingFileError(
                f"no GateSight estimator in {directory}: train one with `bench label --model MODEL` then "
                "`bench train --model MODEL`"
            )
        for name in ("gatesight.json", "gatesight.safetensors"):
            check_regular_file(directory / name, "a GateSight estimator's file")
        settings = directory / "gatesight.json"
        try:
            config = parse_json(read_text_bounded(settings, METADATA_LIMIT, "train the estimator again (`bench "
                                                                            "train --model MODEL`)"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise UsageError(f"{settings}: not valid JSON ({error})") from None
        window, gdn_layers = estimator_settings(config, settings)
        layers = estimator_layers(load_file(str(directory / "gatesight.safetensors")), gdn_layers,
                                  directory / "gatesight.safetensors")
        return cls(window, layers, gdn_layers, config.get("meta", {}), directory)

    def check_model(self, adapter: ModelAdapter) -> None:
        """A :class:`~runtime.errors.UsageError` naming its file where it does not fit ``adapter``'s model (its
        attention and signal layers, KV heads and feature count: :func:`check_estimator_geometry`)."""
        heads = adapter.signal_heads()
        shown = "the GateSight estimator given" if self.directory is None else str(
            self.directory / "gatesight.safetensors")
        check_estimator_geometry(self.layers, self.gdn_layers, adapter,
                                 lambda signal: len(signal) * heads * len(SIGNALS) + len(AGE_FEATURES), shown)


def _load_estimator(directory: Path) -> GateSightEstimator:
    """The estimator saved in ``directory`` (a :class:`~runtime.errors.UsageError` naming it if there is none)."""
    if not directory.is_dir():
        what = not_a_directory(directory)  # a link named with where it leads (/dev/null, nowhere)
        raise UsageError(f"estimator={str(directory)!r}: {what} (give the directory a GateSight estimator was saved "
                         "to, e.g. <model dir>/gatesight)")
    try:  # a folder, a pipe or a device in a file's place: named as such, never read
        for name in ESTIMATOR_FILES:
            check_regular_file(directory / name, "the GateSight estimator's file")
    except UsageError as error:
        raise UsageError(f"estimator={str(directory)!r}: {error}") from None
    missing = [name for name in ESTIMATOR_FILES if not (directory / name).is_file()]
    if missing and all((directory / ARTIFACT_DIR / name).is_file() for name in ESTIMATOR_FILES):
        raise UsageError(f"estimator={str(directory)!r}: no GateSight estimator there, but its {ARTIFACT_DIR}/ "
                         f"folder holds one: give estimator={str(directory / ARTIFACT_DIR)!r} (or nothing: a model's "
                         "own estimator is read from its directory)")
    if missing:
        # a link that leads nowhere named with its target: "no gatesight.safetensors" of a name that is there misleads
        said = ", ".join(missing_file(directory / name) for name in missing) if any(
            link_target(directory / name) for name in missing) else f"no {' or '.join(missing)}"
        raise UsageError(f"estimator={str(directory)!r}: no GateSight estimator there ({said}); "
                         "train one with `bench label --model MODEL` then `bench train --model MODEL`")
    try:  # the checks a model directory's own estimator gets (pretrained.loading.check_artifacts)
        for name in ESTIMATOR_FILES:
            loading.check_artifact(directory / name)
        return GateSightEstimator.load(directory)
    except UsageError as error:
        raise UsageError(f"estimator={str(directory)!r}: {error}") from None


def _check_weights(estimator: GateSightEstimator, model: ModelInfo) -> None:
    """``ValueError`` if ``estimator`` records the weights it was trained on (``meta["weights"]``, the fingerprint
    of the weight files, as ``bench train`` records it) and ``model``'s weight files are others; an estimator
    saved before estimators recorded them, or a directory holding no weight files, is not checked."""
    trained_on, weights, model_dir = estimator.meta.get("weights"), model.weights, model.directory
    if trained_on is None or weights is None or trained_on == weights:
        return
    shown = "the GateSight estimator given" if estimator.directory is None else str(estimator.directory)
    own = estimator.directory is not None and estimator.directory.resolve() == (model_dir / ARTIFACT_DIR).resolve()
    out = "--replace" if own else "--out NEW_DIR (then give estimator=NEW_DIR)"
    raise ValueError(f"{shown} was trained on model weights {trained_on}, not this model's ({weights}): train one on "
                     f"this model (`bench label --model {model_dir} --out LABELS`, then `bench train --model "
                     f"{model_dir} --labels LABELS {out}`)")


class _EstimatorScale:
    """GateSight's ``comparable_scale``: False on the class, which registries read to list the presses whose scores
    always share one scale, and on a press whether its estimator was trained on one scale (``bench train --scale
    one``); a press without an estimator yet (not bound) is not."""

    def __get__(self, press: "GateSightPress | None", owner=None) -> bool:
        return press is not None and isinstance(press.estimator, GateSightEstimator) and press.estimator.scale == "one"


@dataclass
class GateSightPress(Press):
    """Scores = predicted utility (:meth:`GateSightEstimator.utility`) from the GDN signals of the preceding layers:
    on one scale across layers and heads (:attr:`comparable_scale`) when the estimator was trained on one.

    Parameters
    ----------
    estimator : GateSightEstimator or str or Path, optional
        The estimator, or the directory it was saved to (as the CLI's ``gatesight[estimator=DIR]`` gives it).
        Default: loaded from ``<model dir>/gatesight/``.
    signal_dtype : str
        ``float32`` or ``bfloat16``: how prefill stores the GDN signals (bfloat16 halves the evidence memory).
    """

    estimator: GateSightEstimator | str | Path | None = None
    signal_dtype: str = "float32"
    name = "gatesight"
    runs_in_engine = True
    artifact_files = {"estimator": (ARTIFACT_DIR, ESTIMATOR_FILES)}
    # the paper's labels are max-normalised per (document, layer, KV head), so such an estimator's predicted utility
    # says how an entry ranks within its head, not what it is worth against another layer's entries (a global top-B
    # kept nothing of the first attention layer; GateSight's own allocation is the output gate's); an estimator
    # trained on one scale per document compares across layers: the answer is the estimator's, not the class's
    comparable_scale = _EstimatorScale()

    def __post_init__(self):
        if self.signal_dtype not in ("float32", "bfloat16"):
            raise UsageError(f"signal_dtype={self.signal_dtype!r}: choose float32 or bfloat16")
        if isinstance(self.estimator, (str, Path)):
            if not str(self.estimator).strip():  # Path('') is '.', the current directory: never meant
                raise UsageError("estimator='' is empty: give the directory a GateSight estimator was saved to, or "
                                 "leave the option out (a model's own estimator is read from its directory)")
            self.estimator = _load_estimator(Path(self.estimator))
        elif self.estimator is not None and not isinstance(self.estimator, GateSightEstimator):
            raise UsageError(f"estimator={self.estimator!r}: give a GateSightEstimator or the directory it was "
                             "saved to")

    def evidence(self, adapter) -> EvidenceRequest:
        return EvidenceRequest(recurrent_signals=True, signal_dtype=getattr(torch, self.signal_dtype))

    def bind(self, model: ModelInfo | None) -> None:
        """Load the model's own estimator where none was given; refuse (``ValueError``) an estimator trained on
        other model weights than ``model``'s: its features describe another model's signals."""
        artifact = None if model is None else model.directory / ARTIFACT_DIR
        if self.estimator is None and artifact is not None and (artifact / "gatesight.json").exists():
            self.estimator = GateSightEstimator.load(artifact)
        if self.estimator is not None and model is not None:
            _check_weights(self.estimator, model)

    def check(self, adapter: ModelAdapter) -> None:
        if not adapter.signal_layers:
            # named by the model's own layer kinds, so that every family without recurrent layers is refused alike
            kinds = ", ".join(sorted(set(adapter.layer_kinds)))
            raise ValueError(f"GateSight reads the signals of GDN or Mamba2 layers; {type(adapter.model).__name__} "
                             f"has no GDN layers and no Mamba2 layers (its layers: {kinds})")
        if self.estimator is None:
            where = "the model was not loaded from a local directory" if adapter.model_dir is None else (
                f"none was found in {adapter.model_dir / ARTIFACT_DIR}")
            raise ValueError(f"GateSight needs an estimator and {where}: pass estimator= or train one with "
                             "`bench label --model PATH` then `bench train --model PATH`")
        self.estimator.check_model(adapter)

    def score(self, context: ScoringContext) -> Scores:
        self.check(context.adapter)
        if not context.evidence.recurrent_signals:
            raise ValueError("GateSight reads the GDN signals of prefill: "
                             "prefill with evidence=press.evidence(adapter)")
        signals = context.evidence.recurrent_signals
        device = next(iter(signals.values())).device
        estimator = self.estimator.to(device)
        positions = torch.arange(context.protected, context.n, device=device)
        return {
            layer: estimator.utility(layer, build_features(signals, estimator.gdn_layers[layer], context.n, positions))
            for layer in context.adapter.attention_layers
        }

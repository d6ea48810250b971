"""``bench train``: fit the per-(attention layer, KV head) MLPs (paper §4.1, App. G) and the ridge baseline.

Each layer's heads share one feature matrix (the features depend on the layer only), so all heads of a layer are
trained together as a batch of independent MLPs.

Two training targets (``bench train --scale``):

- ``head`` (the paper's, App. G): each (document, layer, KV head) row of utilities divided by its own maximum, fitted
  with binary cross-entropy through a sigmoid. A prediction ranks an entry within its head only: every row's best
  entry is 1, whatever that row's utilities are worth against another layer's.
- ``one``: each document's raw utilities U divided by one constant, the document's largest U over every attention
  layer and KV head, and regressed in log space (:func:`one_scale_targets`). U is the norm of the change that
  removing an entry makes to the attention layer's output *in the residual stream* — the same space, with the same
  units, in every layer — so one divisor keeps the ratio of any two entries' utilities, across layers and heads, and
  the predictions can be ranked against each other (the ``global`` allocator's top-B). What it does not capture:
  the same change of the residual stream at different depths is not worth the same to the output — later layers
  (and the final norm) amplify or damp it differently, and the attention output gate, which Eq. 2 leaves out, scales
  it by a mean that differs across layers by more than an order of magnitude (paper §4.2) — so one scale compares
  the changes the layers' outputs make, not their effect on the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from presses.gatesight import SCALES, GateSightEstimator, build_features, init_mlp, mlp_logits
from runtime.errors import UsageError

LOG_FLOOR = 1e-6
"""Smallest one-scale utility (a fraction of the document's largest) whose logarithm is a target: entries below it
share the target log(floor), so that the regression is not spent telling apart utilities a millionth of the
document's largest (and an entry of utility 0, a row the continuations never attend to, has a finite target)."""


@dataclass
class TrainSettings:
    """How the estimator (and the ridge baseline beside it) is fitted.

    Attributes
    ----------
    hidden : int
        Hidden units of each (layer, KV head) MLP.
    lr, weight_decay : float
        AdamW's learning rate and weight decay.
    clip : float
        Gradient-norm clip.
    epochs : int
        Passes over the sampled positions.
    positions_per_document : int
        Random context positions drawn from each labelled document.
    batch_size : int
        Positions per optimiser step.
    seed : int
        Seeds the position draws, the initialisation and the batch order.
    window : int
        GDN layers before each attention layer whose signals are features (paper: 6).
    scale : str
        The training target (the module docstring): ``head`` (the paper's, max-normalised per (document, layer, KV
        head), BCE) or ``one`` (divided by one constant per document, log space, MSE).
    """

    hidden: int = 64
    lr: float = 2e-3
    weight_decay: float = 1e-2
    clip: float = 1.0
    epochs: int = 12
    positions_per_document: int = 500
    batch_size: int = 256
    seed: int = 0
    window: int = 6
    scale: str = "head"

    def __post_init__(self):
        if self.scale not in SCALES:
            raise UsageError(f"scale={self.scale!r}: choose {' or '.join(SCALES)}")


def one_scale_targets(utilities: dict[int, torch.Tensor], floor: float = LOG_FLOOR) -> dict[int, torch.Tensor]:
    """One document's ``--scale one`` targets: log(max(U / c, floor)), c the largest U over every layer and head.

    Parameters
    ----------
    utilities : dict[int, torch.Tensor]
        Raw utilities ``{attention layer: [H_kv, n]}`` of one document (``load_shard(...)["utilities"]``).
    floor : float
        Smallest ratio U / c kept apart (:data:`LOG_FLOOR`).

    Returns
    -------
    dict[int, torch.Tensor]
        ``{attention layer: [H_kv, n]}``, at most 0; the difference of two targets above the floor is the log of
        their utilities' ratio, whichever layers and heads they are of.
    """
    c = max(float(u.max()) for u in utilities.values())
    return {layer: (u / max(c, 1e-12)).clamp_min(floor).log() for layer, u in utilities.items()}


def training_targets(shards: list[dict], scale: str, where: Path | None = None) -> list[dict[int, torch.Tensor]]:
    """What each shard's entries are fitted to under ``scale``: its max-normalised labels (``head``), or
    :func:`one_scale_targets` of its raw utilities (``one``).

    Parameters
    ----------
    shards : list[dict]
        Label shards (:func:`gatesight_learning.shards.load_shard`).
    scale : str
        ``head`` or ``one`` (:class:`TrainSettings`).
    where : Path or None
        The shards' directory, named in the refusal.

    Raises
    ------
    UsageError
        ``one`` with a shard labelled before shards recorded their scales (no raw utilities), naming it.
    """
    if scale == "head":
        return [shard["labels"] for shard in shards]
    old = next((shard for shard in shards if shard["utilities"] is None), None)
    if old is not None:
        name = Path(where or "") / f"{old['corpus']}--{old['document']}.safetensors"
        raise UsageError(f"{name} records no scales (labelled before shards recorded each row's normaliser): its raw "
                         "utilities are unknown, and --scale one divides them by one constant per document; label "
                         "again into a new directory (`bench label --out DIR`), or train with --scale head")
    return [one_scale_targets(shard["utilities"]) for shard in shards]


def layer_dataset(shards: list[dict], layer: int, gdn_layers: list[int], per_document: int, seed: int,
                  targets: list[dict[int, torch.Tensor]] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Features and targets of ``per_document`` random positions of every document, for one attention layer.

    Parameters
    ----------
    shards : list[dict]
        Label shards (:func:`gatesight_learning.shards.load_shard`): ``signals`` ``{gdn layer: [n, Hv, 3]}`` and
        ``labels`` ``{attention layer: [H_kv, n]}``.
    layer : int
        The attention layer.
    gdn_layers : list[int]
        The GDN layers whose signals are its features.
    per_document, seed : int
        Positions drawn per document (all if fewer), and the draw's seed.
    targets : list[dict[int, torch.Tensor]] or None
        Per shard, ``{attention layer: [H_kv, n]}`` read at the drawn positions (:func:`training_targets`);
        default: the shards' labels.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        Features ``[N, F]`` and targets ``[H_kv, N]``, N summed over the documents.
    """
    generator = torch.Generator().manual_seed(seed)
    xs, ys = [], []
    for shard, target in zip(shards, targets or [shard["labels"] for shard in shards]):
        values = target[layer]
        n = values.shape[1]
        positions = torch.randperm(n, generator=generator)[: min(per_document, n)]
        xs.append(build_features(shard["signals"], gdn_layers, n, positions))
        ys.append(values[:, positions])
    return torch.cat(xs), torch.cat(ys, dim=1)


def train_estimator(shards: list[dict], gdn_windows: dict[int, list[int]], settings: TrainSettings = TrainSettings(),
                    log=None) -> GateSightEstimator:
    """One MLP per (attention layer, KV head), inputs standardised, fitted to the target of ``settings.scale``:
    BCE against the max-normalised utility (``head``), or MSE against the log one-scale utility (``one``; the
    module docstring).

    MSE in log space for ``one``: the targets span orders of magnitude across layers, and a budget compares them by
    ratio, so an error of a given factor costs the same at every magnitude; a BCE or MSE on U / c itself would
    spend the fit on the few largest entries of the document and leave the order of the rest to rounding.

    Parameters
    ----------
    shards : list[dict]
        Label shards, as :func:`layer_dataset` reads them (``utilities`` too for ``one``).
    gdn_windows : dict[int, list[int]]
        ``{attention layer: the GDN layers whose signals are its features}``.
    settings : TrainSettings
    log : Callable[[str], None] or None
        Receives the mean loss of every epoch of every layer.

    Returns
    -------
    GateSightEstimator
        The MLPs with their input standardisation (``mean``, ``std`` ``[F]``) per layer, and a training record (the
        scale among it: ``meta["scale"]``).

    Raises
    ------
    UsageError
        ``one`` with shards that record no scales (:func:`training_targets`).
    """
    targets = training_targets(shards, settings.scale)
    one = settings.scale == "one"
    loss_of, loss_name = ((torch.nn.functional.mse_loss, "MSE of log utility") if one else
                          (torch.nn.functional.binary_cross_entropy_with_logits, "BCE"))
    torch.manual_seed(settings.seed)
    layers = {}
    for layer, gdn_layers in gdn_windows.items():
        x, y = layer_dataset(shards, layer, gdn_layers, settings.positions_per_document, settings.seed, targets)
        mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
        xs = (x - mean) / std
        heads, dims = y.shape[0], x.shape[1]
        mlp = init_mlp(heads, dims, settings.hidden)
        if one:  # start at each head's mean log utility, the best constant: targets lie near log(floor), not at 0
            mlp["b2"] = y.mean(1)
        mlp = {name: value.requires_grad_() for name, value in mlp.items()}
        params = list(mlp.values())
        optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
        generator = torch.Generator().manual_seed(settings.seed)
        for epoch in range(settings.epochs):
            order = torch.randperm(xs.shape[0], generator=generator)
            total = 0.0
            for start in range(0, xs.shape[0], settings.batch_size):
                idx = order[start : start + settings.batch_size]
                loss = loss_of(mlp_logits(xs[idx], mlp), y[:, idx])
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, settings.clip)
                optimizer.step()
                total += float(loss.detach()) * idx.numel()
            if log:
                log(f"layer {layer} epoch {epoch + 1}/{settings.epochs}: {loss_name} {total / xs.shape[0]:.4f}")
        layers[layer] = {"mean": mean, "std": std, **{name: value.detach() for name, value in mlp.items()}}
    return GateSightEstimator(settings.window, layers, dict(gdn_windows),
                              {"documents": len(shards), "settings": settings.__dict__, "scale": settings.scale})


@dataclass
class RidgeModel:
    """Per (layer, KV head) linear map on standardised features: the baseline the MLPs are compared with.

    Attributes
    ----------
    layers : dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
        ``{attention layer: (mean [F], std [F], weights [H_kv, F + 1])}``, the last weight column the bias.
    gdn_windows : dict[int, list[int]]
        ``{attention layer: the GDN layers whose signals are its features}``.
    """

    layers: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    gdn_windows: dict[int, list[int]]

    def predict(self, layer: int, features: torch.Tensor) -> torch.Tensor:
        """Predicted utility ``[H_kv, N]`` of ``features`` ``[N, F]`` at ``layer``."""
        mean, std, weights = self.layers[layer]
        x = torch.cat([(features - mean) / std, torch.ones(features.shape[0], 1)], dim=1)
        return weights @ x.T


def fit_ridge(shards: list[dict], gdn_windows: dict[int, list[int]], alpha: float = 1.0,
              per_document: int = 500, seed: int = 0) -> RidgeModel:
    """Ridge regression (penalty ``alpha`` on every weight, the bias included) of the utility on the same features
    and positions as :func:`train_estimator` (:func:`layer_dataset`), solved in float64."""
    layers = {}
    for layer, gdn_layers in gdn_windows.items():
        x, y = layer_dataset(shards, layer, gdn_layers, per_document, seed)
        mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
        design = torch.cat([(x - mean) / std, torch.ones(x.shape[0], 1)], dim=1).double()
        gram = design.T @ design + alpha * torch.eye(design.shape[1], dtype=torch.float64)
        weights = torch.linalg.solve(gram, design.T @ y.double().T).T.float()
        layers[layer] = (mean, std, weights)
    return RidgeModel(layers, dict(gdn_windows))

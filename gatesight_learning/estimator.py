"""``bench train``: fit the per-(attention layer, KV head) MLPs (paper §4.1, App. G) and the ridge baseline.

Each layer's heads share one feature matrix (the features depend on the layer only), so all heads of a layer are
trained together as a batch of independent MLPs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from presses.gatesight import GateSightEstimator, build_features, init_mlp, mlp_logits


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


def layer_dataset(shards: list[dict], layer: int, gdn_layers: list[int], per_document: int,
                  seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Features and targets of ``per_document`` random positions of every document, for one attention layer.

    Parameters
    ----------
    shards : list[dict]
        Label shards (:func:`gatesight_learning.record.load_shard`): ``signals`` ``{gdn layer: [n, Hv, 3]}`` and
        ``labels`` ``{attention layer: [H_kv, n]}``.
    layer : int
        The attention layer.
    gdn_layers : list[int]
        The GDN layers whose signals are its features.
    per_document, seed : int
        Positions drawn per document (all if fewer), and the draw's seed.

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor]
        Features ``[N, F]`` and targets ``[H_kv, N]``, N summed over the documents.
    """
    generator = torch.Generator().manual_seed(seed)
    xs, ys = [], []
    for shard in shards:
        labels = shard["labels"][layer]
        n = labels.shape[1]
        positions = torch.randperm(n, generator=generator)[: min(per_document, n)]
        xs.append(build_features(shard["signals"], gdn_layers, n, positions))
        ys.append(labels[:, positions])
    return torch.cat(xs), torch.cat(ys, dim=1)


def train_estimator(shards: list[dict], gdn_windows: dict[int, list[int]], settings: TrainSettings = TrainSettings(),
                    log=None) -> GateSightEstimator:
    """One MLP per (attention layer, KV head), BCE against the max-normalised utility, inputs standardised.

    Parameters
    ----------
    shards : list[dict]
        Label shards, as :func:`layer_dataset` reads them.
    gdn_windows : dict[int, list[int]]
        ``{attention layer: the GDN layers whose signals are its features}``.
    settings : TrainSettings
    log : Callable[[str], None] or None
        Receives the mean BCE of every epoch of every layer.

    Returns
    -------
    GateSightEstimator
        The MLPs with their input standardisation (``mean``, ``std`` ``[F]``) per layer, and a training record.
    """
    torch.manual_seed(settings.seed)
    layers = {}
    for layer, gdn_layers in gdn_windows.items():
        x, y = layer_dataset(shards, layer, gdn_layers, settings.positions_per_document, settings.seed)
        mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
        xs = (x - mean) / std
        heads, dims = y.shape[0], x.shape[1]
        mlp = {name: value.requires_grad_() for name, value in init_mlp(heads, dims, settings.hidden).items()}
        params = list(mlp.values())
        optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
        generator = torch.Generator().manual_seed(settings.seed)
        for epoch in range(settings.epochs):
            order = torch.randperm(xs.shape[0], generator=generator)
            total = 0.0
            for start in range(0, xs.shape[0], settings.batch_size):
                idx = order[start : start + settings.batch_size]
                logits = mlp_logits(xs[idx], mlp)
                loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y[:, idx])
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, settings.clip)
                optimizer.step()
                total += float(loss.detach()) * idx.numel()
            if log:
                log(f"layer {layer} epoch {epoch + 1}/{settings.epochs}: BCE {total / xs.shape[0]:.4f}")
        layers[layer] = {"mean": mean, "std": std, **{name: value.detach() for name, value in mlp.items()}}
    return GateSightEstimator(settings.window, layers, dict(gdn_windows),
                              {"documents": len(shards), "settings": settings.__dict__})


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

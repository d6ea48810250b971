"""Evaluation of utility predictors (paper App. C): Spearman ρ, overlap@k and coverage@k, averaged over KV heads,
documents, then layers; leave-one-corpus-out for the learned predictors."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from statistics import mean
from typing import Callable

import torch

from presses.gatesight import build_features

from .estimator import TrainSettings, fit_ridge, train_estimator

FRACTIONS = (0.05, 0.10, 0.20)


def average_ranks(x: torch.Tensor) -> torch.Tensor:
    """float64 ranks (0-based) along the last axis of ``x`` ``[..., n]``, tied values sharing their average rank."""
    flat = x.reshape(-1, x.shape[-1]).double()
    rows, n = flat.shape
    values, order = flat.sort(dim=-1, stable=True)
    starts = torch.ones_like(values, dtype=torch.bool)
    starts[:, 1:] = values[:, 1:] != values[:, :-1]
    # one id per run of equal values, distinct across rows, so that one index_add averages every run at once
    group = (starts.cumsum(-1) - 1 + torch.arange(rows)[:, None] * n).flatten()
    position = torch.arange(n, dtype=torch.float64).repeat(rows)
    sums = torch.zeros(rows * n, dtype=torch.float64).index_add_(0, group, position)
    counts = torch.zeros(rows * n, dtype=torch.float64).index_add_(0, group, torch.ones_like(position))
    ranks = torch.empty_like(flat).scatter_(-1, order, (sums / counts.clamp_min(1))[group].view(rows, n))
    return ranks.view(x.shape)


def _unit_ranks(x: torch.Tensor) -> torch.Tensor:
    """``[..., n]`` average ranks, centred and scaled to unit norm along the last axis (a constant row: zeros), so
    that the dot product of two rows is their Spearman ρ."""
    ranks = average_ranks(x)
    ranks = ranks - ranks.mean(-1, keepdim=True)
    norm = ranks.norm(dim=-1, keepdim=True)
    return torch.where(norm > 0, ranks / norm.clamp_min(1e-300), torch.zeros_like(ranks))


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Rank correlation of two ``[n]`` vectors (average ranks for ties; 0 if either is constant)."""
    return float(_unit_ranks(a) @ _unit_ranks(b))


def overlap_and_coverage(pred: torch.Tensor, truth: torch.Tensor, fraction: float) -> tuple[float, float]:
    """How well the predicted top ``fraction`` of entries matches the true one.

    Parameters
    ----------
    pred, truth : torch.Tensor
        ``[n]`` predicted and true utilities of one KV head.
    fraction : float
        The share k / n of entries compared (k at least 1).

    Returns
    -------
    tuple[float, float]
        Overlap@k (the share of the true top k that is predicted) and coverage@k (the true utility the predicted
        top k holds, as a share of the most any k entries hold).
    """
    k = max(1, math.ceil(fraction * truth.numel()))
    top_pred = torch.topk(pred, k).indices
    top_true = torch.topk(truth, k).indices
    overlap = len(set(top_pred.tolist()) & set(top_true.tolist())) / k
    coverage = float(truth[top_pred].sum() / truth[top_true].sum().clamp_min(1e-12))
    return overlap, coverage


Predictor = Callable[[dict, int], torch.Tensor]
"""(shard, attention layer) -> ``[H_kv, n]`` predicted utilities."""


def evaluate(predictor: Predictor, shards: list[dict]) -> dict[str, float]:
    """Metrics averaged over KV heads, then documents, then layers.

    Parameters
    ----------
    predictor : Predictor
    shards : list[dict]
        Label shards (:func:`gatesight_learning.shards.load_shard`): ``signals`` ``{gdn layer: [n, Hv, 3]}``,
        ``labels`` ``{attention layer: [H_kv, n]}``.

    Returns
    -------
    dict[str, float]
        ``rho`` (Spearman), ``ov@5|10|20`` and ``cov@5|10|20`` (:func:`overlap_and_coverage` at :data:`FRACTIONS`).
    """
    per_layer = evaluate_per_layer(predictor, shards)
    keys = next(iter(per_layer.values())).keys()
    return {key: mean(per_layer[layer][key] for layer in per_layer) for key in keys}


def evaluate_per_layer(predictor: Predictor, shards: list[dict]) -> dict[int, dict[str, float]]:
    """``{attention layer: metrics}``, each averaged over KV heads, then documents (the metrics of :func:`evaluate`)."""
    per_layer: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for shard in shards:
        for layer, truth in shard["labels"].items():
            pred = predictor(shard, layer)
            heads = defaultdict(list)
            for h in range(truth.shape[0]):
                heads["rho"].append(spearman(pred[h], truth[h]))
                for f in FRACTIONS:
                    o, c = overlap_and_coverage(pred[h], truth[h], f)
                    heads[f"ov@{int(f * 100)}"].append(o)
                    heads[f"cov@{int(f * 100)}"].append(c)
            for key, values in heads.items():
                per_layer[layer][key].append(mean(values))
    return {layer: {key: mean(values) for key, values in metrics.items()} for layer, metrics in per_layer.items()}


def _window_mean(shard: dict, gdn_layers: list[int], fn) -> torch.Tensor:
    return torch.stack([fn(shard["signals"][j]) for j in gdn_layers]).mean(0)  # [n]


def heuristic_predictors(gdn_windows: dict[int, list[int]], slow_heads: dict[int, list[int]], seed: int = 0):
    """Untrained predictors of Table 1 / Table 5: random, age, window-mean signals, slow-head writes.

    Parameters
    ----------
    gdn_windows : dict[int, list[int]]
        ``{attention layer: the GDN layers before it whose signals are read}``.
    slow_heads : dict[int, list[int]]
        ``{gdn layer: its slow value heads}`` (:func:`gatesight_learning.analyze.slow_heads_by_layer`).
    seed : int
        Seeds the random predictor.

    Returns
    -------
    dict[str, Predictor]
        By the name the tables show; a signal predictor gives every KV head the same ``[n]`` scores.
    """
    def broadcast(shard, layer, vector):
        return vector.expand(shard["labels"][layer].shape[0], -1)

    beta = lambda s: s[..., 0].mean(-1)  # noqa: E731
    forget = lambda s: -s[..., 1].mean(-1)  # noqa: E731
    vnorm = lambda s: s[..., 2].mean(-1)  # noqa: E731
    write = lambda s: (s[..., 0] * s[..., 2]).mean(-1)  # noqa: E731

    def slow_write(shard, layer):
        cells = [(shard["signals"][j][..., 0] * shard["signals"][j][..., 2])[:, slow_heads.get(j, [])]
                 for j in gdn_windows[layer] if slow_heads.get(j)]
        if not cells:
            return torch.zeros(shard["labels"][layer].shape[1])
        return torch.cat(cells, dim=1).mean(1)

    def window_mean(signal):
        return lambda shard, layer: broadcast(shard, layer, _window_mean(shard, gdn_windows[layer], signal))

    generator = torch.Generator().manual_seed(seed)
    return {
        "random": lambda shard, layer: torch.rand(shard["labels"][layer].shape, generator=generator),
        "age (older first)": lambda shard, layer: broadcast(
            shard, layer, -torch.arange(shard["labels"][layer].shape[1], dtype=torch.float32)),
        "β (window mean)": window_mean(beta),
        "−g (window mean)": window_mean(forget),
        "‖v‖ (window mean)": window_mean(vnorm),
        "β‖v‖ (window mean)": window_mean(write),
        "slow-head β‖v‖": lambda shard, layer: broadcast(shard, layer, slow_write(shard, layer)),
    }


def single_head_oracle(shards: list[dict], gdn_windows: dict[int, list[int]]) -> Predictor:
    """In-sample ceiling of one-cell rules: per (layer, KV head) the (GDN layer, head, signal, sign) with best ρ."""
    # every cell's ρ with every head's labels at once: each document's signal ranks computed once per GDN layer
    rho: dict[int, dict[int, torch.Tensor]] = {layer: {} for layer in gdn_windows}  # {layer: {gdn: [H, M * 3]}}
    for shard in shards:
        cells = {j: _unit_ranks(shard["signals"][j].flatten(1).T)  # [M * 3, n], cell (m, s) at row 3 m + s
                 for j in {j for gdn_layers in gdn_windows.values() for j in gdn_layers}}
        for layer, gdn_layers in gdn_windows.items():
            labels = _unit_ranks(shard["labels"][layer])  # [H, n]
            for j in gdn_layers:
                rho[layer][j] = rho[layer].get(j, 0) + labels @ cells[j].T / len(shards)
    best: dict[tuple[int, int], tuple] = {}
    for layer, gdn_layers in gdn_windows.items():
        for h in range(shards[0]["labels"][layer].shape[0]):
            candidates = [(abs(float(r)), (j, m, s, 1.0 if r >= 0 else -1.0))
                          for j in gdn_layers for (m, s), r in zip(itertools.product(
                              range(rho[layer][j].shape[1] // 3), range(3)), rho[layer][j][h])]
            best[(layer, h)] = max(candidates)[1]

    def predict(shard, layer):
        rows = []
        for h in range(shard["labels"][layer].shape[0]):
            j, m, s, sign = best[(layer, h)]
            rows.append(sign * shard["signals"][j][:, m, s])
        return torch.stack(rows)

    return predict


def learned_predictors_loco(shards: list[dict], gdn_windows, settings: TrainSettings, log=None, per_layer=None):
    """Ridge and MLP, each evaluated leave-one-corpus-out: metrics averaged over held-out corpora.

    Parameters
    ----------
    shards : list[dict]
        Label shards (:func:`gatesight_learning.shards.load_shard`): ``signals`` ``{gdn layer: [n, Hv, 3]}``,
        ``labels`` ``{attention layer: [H_kv, n]}``.
    gdn_windows : dict[int, list[int]]
        ``{attention layer: the GDN layers whose signals are its features}``.
    settings : TrainSettings
        How both are fitted on the other corpora.
    log : Callable[[str], None] or None
        Receives one line per held-out corpus.
    per_layer : dict or None
        If given, filled with ``{predictor: {layer: {metric: value}}}`` (observation 3 compares them per layer).

    Returns
    -------
    dict[str, dict[str, float]]
        ``{"ridge" | "MLP (GateSight)": the metrics of :func:`evaluate`}``.
    """
    corpora = sorted({s["corpus"] for s in shards})
    results = {"ridge": defaultdict(list), "MLP (GateSight)": defaultdict(list)}
    layers = {name: defaultdict(lambda: defaultdict(list)) for name in results}
    for corpus in corpora:
        train, test = split_by_corpus(shards, corpus)
        if not train or not test:
            continue
        ridge = fit_ridge(train, gdn_windows, per_document=settings.positions_per_document, seed=settings.seed)
        mlp = train_estimator(train, gdn_windows, settings)

        def feats(shard, layer):
            n = shard["labels"][layer].shape[1]
            return build_features(shard["signals"], gdn_windows[layer], n, torch.arange(n))

        for name, predictor in (("ridge", lambda sh, layer: ridge.predict(layer, feats(sh, layer))),
                                ("MLP (GateSight)", lambda sh, layer: mlp.logits(layer, feats(sh, layer)))):
            by_layer = evaluate_per_layer(predictor, test)
            for layer, metrics in by_layer.items():
                for key, value in metrics.items():
                    layers[name][layer][key].append(value)
            for key in next(iter(by_layer.values())):
                results[name][key].append(mean(metrics[key] for metrics in by_layer.values()))
        if log:
            log(f"held out {corpus}: {len(train)} train / {len(test)} test documents done")
    if per_layer is not None:
        per_layer.update({name: {layer: {k: mean(v) for k, v in m.items()} for layer, m in by_layer.items()}
                          for name, by_layer in layers.items()})
    return {name: {k: mean(v) for k, v in metrics.items()} for name, metrics in results.items()}


def split_by_corpus(shards: list[dict], held_out: str) -> tuple[list[dict], list[dict]]:
    """(train, test) with every document of ``held_out`` in test and none in train."""
    return [s for s in shards if s["corpus"] != held_out], [s for s in shards if s["corpus"] == held_out]

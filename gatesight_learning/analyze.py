"""``bench analyze``: the paper's three observations on this model (§3, App. C), as tables and PNG figures, with the
paper's Qwen3.8-27B figures beside ours. Observation 3 reads the leave-one-corpus-out evaluation that ``bench train``
stores in the GateSight artifact."""

from __future__ import annotations

import math
import random
from statistics import mean, median

import torch

from hybridmodel.half_lives import static_half_lives
from runtime.errors import UsageError

from .evaluate import evaluate, heuristic_predictors, spearman

LN_HALF = math.log(0.5)


def half_lives(shard: dict) -> dict[tuple[int, int], float]:
    """Memory half-life ln 0.5 / ḡ (tokens) of every (GDN layer, value head) on one document.

    Parameters
    ----------
    shard : dict
        A label shard: ``signals`` ``{gdn layer: [n, Hv, 3]}``, g the second signal (negative).

    Returns
    -------
    dict[tuple[int, int], float]
        ``{(gdn layer, value head): half-life}``; inf for a head that never forgets.
    """
    out = {}
    for layer, signals in shard["signals"].items():
        mean_g = signals[..., 1].mean(0)  # [Hv], negative
        for head, g in enumerate(mean_g.tolist()):
            out[(layer, head)] = LN_HALF / g if g < 0 else float("inf")
    return out


def observation_1(shards: list[dict], model, threshold: float, pairs: int = 30, seed: int = 0) -> dict:
    """Observation 1: GDN memory dynamics are a stable property of each head.

    Parameters
    ----------
    shards : list[dict]
        Label shards (:func:`half_lives` reads their signals).
    model : transformers causal LM
        The model they were recorded on, for its static half-lives (:func:`hybridmodel.half_lives.static_half_lives`).
    threshold : float
        Median half-life (tokens) from which a head is slow.
    pairs : int
        Random document pairs whose half-life rankings are correlated.
    seed : int
        Which pairs.

    Returns
    -------
    dict
        The table's measures (median half-life, pair Spearman median and min, static vs measured Spearman, slow and
        all heads, the median Jaccard of each document's slow set with the overall one), plus ``medians``
        ``{(layer, head): half-life}`` and ``slow`` (sorted ``(layer, head)``).
    """
    per_doc = [half_lives(s) for s in shards]
    cells = sorted(per_doc[0])
    medians = {c: median(d[c] for d in per_doc) for c in cells}
    rng = random.Random(seed)
    pair_rhos = []
    for _ in range(min(pairs, len(per_doc) * (len(per_doc) - 1) // 2)):
        a, b = rng.sample(per_doc, 2)
        pair_rhos.append(spearman(torch.tensor([a[c] for c in cells]), torch.tensor([b[c] for c in cells])))
    static = static_half_lives(model)
    static_rho = spearman(torch.tensor([static[c] for c in cells]), torch.tensor([medians[c] for c in cells]))
    slow = {c for c in cells if medians[c] >= threshold}
    jaccards = []
    for d in per_doc:
        own = {c for c in cells if d[c] >= threshold}
        union = own | slow
        jaccards.append(len(own & slow) / len(union) if union else 1.0)
    return {"median half-life": median(medians.values()), "pair spearman (median)": median(pair_rhos),
            "pair spearman (min)": min(pair_rhos), "static vs measured spearman": static_rho,
            "slow heads": len(slow), "heads": len(cells), "slow-set jaccard (median)": median(jaccards),
            "medians": medians, "slow": sorted(slow)}


def slow_heads_by_layer(slow: list[tuple[int, int]]) -> dict[int, list[int]]:
    """``[(gdn layer, head), ...]`` -> ``{gdn layer: [head, ...]}``."""
    out: dict[int, list[int]] = {}
    for layer, head in slow:
        out.setdefault(layer, []).append(head)
    return out


def observation_2(shards: list[dict], gdn_windows, slow: dict[int, list[int]]) -> dict:
    """Spearman of U with each window-mean signal, per attention layer, and the slow-head decile lift."""
    predictors = heuristic_predictors(gdn_windows, slow)
    names = ["β (window mean)", "−g (window mean)", "‖v‖ (window mean)", "β‖v‖ (window mean)", "slow-head β‖v‖"]
    table = {}
    for layer in gdn_windows:
        for name in names:
            only = [{**s, "labels": {layer: s["labels"][layer]}} for s in shards]
            table[(layer, name)] = evaluate(predictors[name], only)["rho"]
    top, bottom = [], []
    for shard in shards:
        for layer in gdn_windows:
            signal = predictors["slow-head β‖v‖"](shard, layer)[0]
            for truth in shard["labels"][layer]:
                k = max(1, len(truth) // 10)
                top_true = set(torch.topk(truth, k).indices.tolist())
                bottom_true = set(torch.topk(-truth, k).indices.tolist())
                top_sig, bottom_sig = torch.topk(signal, k).indices.tolist(), torch.topk(-signal, k).indices.tolist()
                top.append(sum(i in top_true for i in top_sig) / k)
                bottom.append(sum(i in bottom_true for i in bottom_sig) / k)
    return {"rho": table, "top-decile lift": mean(top) / 0.1, "bottom-decile lift": mean(bottom) / 0.1}


def plot_half_lives(medians: dict, threshold: float, path) -> None:
    """Scatter of the measured half-lives ``{(layer, head): tokens}`` by GDN layer (log scale), threshold marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = sorted({layer for layer, _ in medians})
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    for layer in layers:
        values = [v for (cell_layer, _), v in medians.items() if cell_layer == layer]
        ax.scatter([layer] * len(values), values, s=12, color="tab:blue")
    ax.axhline(threshold, color="tab:orange", linestyle="--", label=f"slow threshold {threshold:g}")
    ax.set_yscale("log")
    ax.set_xlabel("GDN layer")
    ax.set_ylabel("median half-life (tokens)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


PAPER = {
    "median half-life": 24.0, "pair spearman (median)": 0.99, "static vs measured spearman": 0.942,
    "top-decile lift": 1.92, "bottom-decile lift": 1.82,
    "rho": {"β (window mean)": 0.11, "−g (window mean)": 0.11, "‖v‖ (window mean)": 0.09, "β‖v‖ (window mean)": 0.10,
            "slow-head β‖v‖": 0.23},
    "table 1": {"ridge": (0.548, 38.6, 55.8), "MLP (GateSight)": (0.543, 41.0, 58.4)},
}
"""Qwen3.8-27B figures of the paper (§3, Table 1, Figure 2) shown beside this model's."""


def observation_3(meta: dict) -> dict:
    """Ridge against the MLP on the same features, leave-one-corpus-out: overall ρ, and the high-utility tail
    (Ov@10, Cov@10) overall and per attention layer. ``meta`` is the GateSight artifact's training record."""
    if "loco_per_layer" not in meta:
        raise UsageError("the GateSight artifact has no per-layer leave-one-corpus-out evaluation: run `bench train` "
                         "(this version) first")
    overall = {name: meta["loco"][name] for name in ("ridge", "MLP (GateSight)")}
    ridge, mlp = (meta["loco_per_layer"][name] for name in ("ridge", "MLP (GateSight)"))
    ahead = {key: sum(mlp[layer][key] > ridge[layer][key] for layer in mlp) for key in ("rho", "ov@10", "cov@10")}
    return {"overall": overall, "layers ahead": ahead, "layers": len(mlp)}


def plot_half_life_histogram(medians: dict, threshold: float, path) -> None:
    """Histogram of the measured half-lives of every GDN head (log bins), the slow threshold marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    values = np.clip(np.array(list(medians.values()), dtype=float), 1e-2, 1e5)
    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=120)
    ax.hist(values, bins=np.logspace(-2, 5, 29), color="tab:blue", edgecolor="white")
    ax.axvline(threshold, color="tab:orange", linestyle="--", label=f"slow threshold {threshold:g} tokens")
    ax.set_xscale("log")
    ax.set_xlabel("measured half-life ln 0.5 / mean g (tokens)")
    ax.set_ylabel("GDN heads")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

"""``bench analyze``: the paper's observations 1 and 2 on this model (§3.1–3.2, App. C), as tables and PNG figures.
Observation 3 (a linear map against the MLP on the high-utility tail) is the leave-one-corpus-out table that
``bench train`` writes (``evaluation.md``)."""

from __future__ import annotations

import math
import random
from statistics import mean, median

import torch

from .evaluate import evaluate, heuristic_predictors, spearman

LN_HALF = math.log(0.5)


def half_lives(shard: dict) -> dict[tuple[int, int], float]:
    """Memory half-life ln 0.5 / ḡ (tokens) of every (GDN layer, value head) on one document."""
    out = {}
    for layer, signals in shard["signals"].items():
        mean_g = signals[..., 1].mean(0)  # [Hv], negative
        for head, g in enumerate(mean_g.tolist()):
            out[(layer, head)] = LN_HALF / g if g < 0 else float("inf")
    return out


def static_half_lives(model) -> dict[tuple[int, int], float]:
    """ln 2 / (exp(A_log) · softplus(dt_bias)) from the weights alone (a = 0)."""
    out = {}
    for index, layer in enumerate(model.model.layers):
        if hasattr(layer, "linear_attn"):
            module = layer.linear_attn
            rate = module.A_log.float().exp() * torch.nn.functional.softplus(module.dt_bias.float())
            for head, r in enumerate(rate.tolist()):
                out[(index, head)] = math.log(2) / r
    return out


def observation_1(shards: list[dict], model, threshold: float, pairs: int = 30, seed: int = 0) -> dict:
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
                top_true, bottom_true = set(torch.topk(truth, k).indices.tolist()), set(torch.topk(-truth, k).indices.tolist())
                top_sig, bottom_sig = torch.topk(signal, k).indices.tolist(), torch.topk(-signal, k).indices.tolist()
                top.append(sum(i in top_true for i in top_sig) / k)
                bottom.append(sum(i in bottom_true for i in bottom_sig) / k)
    return {"rho": table, "top-decile lift": mean(top) / 0.1, "bottom-decile lift": mean(bottom) / 0.1}


def plot_half_lives(medians: dict, threshold: float, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = sorted({layer for layer, _ in medians})
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    for layer in layers:
        values = [v for (l, _), v in medians.items() if l == layer]
        ax.scatter([layer] * len(values), values, s=12, color="tab:blue")
    ax.axhline(threshold, color="tab:orange", linestyle="--", label=f"slow threshold {threshold:g}")
    ax.set_yscale("log")
    ax.set_xlabel("GDN layer")
    ax.set_ylabel("median half-life (tokens)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

"""The GateSight pipeline behind ``bench label``, ``bench train`` and ``bench analyze``."""

from __future__ import annotations

import json
from pathlib import Path

from presses.gatesight import ARTIFACT_DIR, gdn_window
from runtime import adapter_for

from .. import models
from .estimator import TrainSettings, train_estimator
from .evaluate import evaluate, heuristic_predictors, learned_predictors_loco, single_head_oracle
from .record import load_shard, record_corpus


def _shards(labels_dir: Path) -> list[dict]:
    paths = sorted(Path(labels_dir).glob("*.safetensors"))
    if not paths:
        raise FileNotFoundError(f"no label shards in {labels_dir}: run `bench label --out {labels_dir}` first")
    return [load_shard(p) for p in paths]


def label(model_path, out: Path, limit, tokens: int, continuations: int, max_new_tokens: int, seed: int) -> None:
    model, tokenizer, directory = models.load(model_path)
    record_corpus(model, tokenizer, out, limit, tokens, continuations, max_new_tokens, seed,
                  weights=models.fingerprint(directory, "model*.safetensors"))


def _table(rows: dict[str, dict[str, float]]) -> str:
    keys = ["rho", "ov@5", "ov@10", "ov@20", "cov@5", "cov@10", "cov@20"]
    lines = ["| predictor | ρ | Ov@5 | Ov@10 | Ov@20 | Cov@5 | Cov@10 | Cov@20 |", "|---|" + "---|" * len(keys)]
    for name, metrics in rows.items():
        cells = [f"{metrics['rho']:+.3f}"] + [f"{100 * metrics[k]:.1f}" for k in keys[1:]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def train(model_path, labels_dir: Path, out: Path | None, slow_threshold: float, settings: TrainSettings) -> str:
    from .analyze import observation_1, slow_heads_by_layer

    model, _, directory = models.load(model_path)
    adapter = adapter_for(model)
    shards = _shards(labels_dir)
    windows = {layer: gdn_window(adapter, layer, settings.window) for layer in adapter.attention_layers}
    slow = slow_heads_by_layer(observation_1(shards, model, slow_threshold)["slow"])
    rows = {}
    rows.update({name: evaluate(p, shards) for name, p in heuristic_predictors(windows, slow).items()})
    rows["single-head oracle (in-sample)"] = evaluate(single_head_oracle(shards, windows), shards)
    rows.update(learned_predictors_loco(shards, windows, settings, log=print))
    table = _table(rows)
    estimator = train_estimator(shards, windows, settings, log=print)
    estimator.meta.update({"corpora": sorted({s["corpus"] for s in shards}), "loco": rows,
                           "slow_threshold": slow_threshold})
    target = out or directory / ARTIFACT_DIR
    estimator.save(target)
    (Path(target) / "evaluation.md").write_text(table + "\n")
    print(table)
    print(f"estimator saved to {target}")
    return table


def analyze(model_path, labels_dir: Path, out: Path, slow_threshold: float) -> None:
    from .analyze import observation_1, observation_2, plot_half_lives, slow_heads_by_layer

    model, _, _ = models.load(model_path)
    adapter = adapter_for(model)
    shards = _shards(labels_dir)
    out.mkdir(parents=True, exist_ok=True)
    windows = {layer: gdn_window(adapter, layer) for layer in adapter.attention_layers}
    obs1 = observation_1(shards, model, slow_threshold)
    plot_half_lives(obs1["medians"], slow_threshold, out / "half_lives.png")
    obs2 = observation_2(shards, windows, slow_heads_by_layer(obs1["slow"]))
    lines = ["## Observation 1: GDN memory dynamics", ""]
    for key in ("median half-life", "pair spearman (median)", "pair spearman (min)", "static vs measured spearman",
                "slow heads", "heads", "slow-set jaccard (median)"):
        value = obs1[key]
        lines.append(f"- {key}: {value:.3f}" if isinstance(value, float) else f"- {key}: {value}")
    names = sorted({k[1] for k in obs2["rho"]})
    lines += ["", "![half-lives](half_lives.png)", "", "## Observation 2: Spearman ρ of U with native signals", "",
              "| attention layer | " + " | ".join(names) + " |"]
    lines.append("|---|" + "---|" * len(names))
    for layer in windows:
        lines.append(f"| {layer} | " + " | ".join(f"{obs2['rho'][(layer, n)]:+.3f}" for n in names) + " |")
    lines += ["", f"- slow-head β‖v‖ top-decile lift: {obs2['top-decile lift']:.2f}×, "
              f"bottom-decile lift: {obs2['bottom-decile lift']:.2f}×"]
    text = "\n".join(lines) + "\n"
    (out / "observations.md").write_text(text)
    (out / "observations.json").write_text(json.dumps(
        {k: v for k, v in obs1.items() if k not in ("medians", "slow")} | {"lift": [obs2["top-decile lift"],
                                                                                     obs2["bottom-decile lift"]]},
        indent=2))
    print(text)

"""The steps of GateSight's learning: label, train, analyze (``bench label``, ``bench train`` and ``bench analyze``
run them; their flags are in :mod:`bench.commands.learning_commands`)."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

from tqdm import tqdm

from artifacts.files import check_replaceable, install, rebuilt_path, write_rebuilt
from artifacts.output_kinds import ESTIMATOR, LABEL_SHARDS, other_kind
from presses.gatesight import ARTIFACT_DIR, gdn_window
from pretrained import loading
from pretrained.file_record import record_again
from runtime import adapter_for
from runtime.errors import UsageError

from .estimator import TrainSettings, train_estimator, training_targets
from .evaluate import FRACTIONS, evaluate, heuristic_predictors, learned_predictors_loco, single_head_oracle
from .record import check_together, record_corpus
from .shards import SHARD_FILES, check_shards, label_settings, load_shard, shard_settings

ESTIMATOR_FILES = ESTIMATOR.files
"""What holds a trained estimator in its directory (:meth:`presses.gatesight.GateSightEstimator.save`)."""
MIN_WINDOWS = 2
"""Fewest labelled windows ``bench train`` and ``bench analyze`` read: observation 1 correlates documents in pairs."""
MIN_CORPORA = 2
"""Fewest corpora ``bench train`` reads: it evaluates the estimator with one corpus held out, trained on the rest."""
MIN_TOKENS = 2 * math.ceil(1 / min(FRACTIONS))
"""Fewest ``tokens`` per labelling window: the shortest window kept (half of one, :func:`~gatesight_learning.record.
corpus_windows`) must hold a token in the smallest top fraction the estimator is ranked by (Ov@5, Cov@5), else
every ranking metric compares the whole window with itself."""


def _label_command(model_path, out) -> str:
    """``bench label`` of the model ``model_path`` (a :class:`~pretrained.loading.ModelSpec`, a path or None: the
    default model) into ``out``, as advice shows it: labels of another model would not do."""
    spec = model_path if isinstance(model_path, loading.ModelSpec) else loading.ModelSpec(model_path)
    flags = ([f"--model {spec.path}"] if spec.path is not None else []) + (
        [f"--dtype {spec.dtype}"] if spec.dtype != loading.ModelSpec.dtype else [])
    return " ".join(["bench label", *flags, f"--out {out}"])


def _shards(labels_dir: Path, weights: str, model_path, futures: str = "labels") -> list[dict]:
    """The label shards of ``labels_dir``, refused if there are none, if they were labelled with different weights
    or settings (:func:`gatesight_learning.shards.check_shards`), or by weights other than ``weights``, those of the
    model ``model_path`` they are read for (labels of other weights describe another model)."""
    if Path(labels_dir).is_file():
        raise UsageError(f"--labels {labels_dir} is a file: give the folder of label shards that `bench label --out` "
                         f"wrote (here perhaps {Path(labels_dir).parent})")
    paths = sorted(Path(labels_dir).glob(SHARD_FILES))
    other = other_kind(Path(labels_dir), LABEL_SHARDS) if not paths else None
    if other is not None:  # the advice below would be refused: label --out never writes into another kind
        raise UsageError(f"--labels {labels_dir}: holds {other}, not label shards: give the folder a `bench label "
                         "--out` wrote")
    if not paths:
        raise FileNotFoundError(f"no label shards in {labels_dir}: run `{_label_command(model_path, labels_dir)}` "
                                "first")
    check_shards(paths)
    labelled = shard_settings(paths[0])["weights"]
    if labelled != weights:
        raise UsageError(f"{labels_dir} was labelled by model weights {labelled}, not this model's ({weights}): "
                         f"label this model into a new directory (`{_label_command(model_path, 'DIR')}`)")
    return [load_shard(p, futures) for p in tqdm(paths, desc="read labels", unit="shard", leave=False)]


def _check_enough(shards: list[dict], labels_dir: Path, command: str, model_path) -> None:
    """A :class:`~runtime.errors.UsageError` unless ``shards`` are enough windows for ``command`` (``train`` also
    needs them from enough corpora), naming the minimum: fewer leave a statistic of nothing."""
    corpora = len({s["corpus"] for s in shards})
    needs = (f"at least {MIN_WINDOWS} windows from at least {MIN_CORPORA} corpora (it is evaluated "
             "leave-one-corpus-out)" if command == "train" else
             f"at least {MIN_WINDOWS} windows (observation 1 correlates documents in pairs)")
    if len(shards) < MIN_WINDOWS or (command == "train" and corpora < MIN_CORPORA):
        windows = f"{len(shards)} labelled window{'s' * (len(shards) != 1)}"
        raise UsageError(f"{labels_dir} holds {windows} (of {corpora} {'corpus' if corpora == 1 else 'corpora'}); "
                         f"{command} needs {needs}: label more into it (`{_label_command(model_path, labels_dir)}`,"
                         " with a larger --limit or none)")


def _weights(model_path) -> str:
    """The fingerprint of the model's weight files: what label shards and an estimator record of the model."""
    return loading.fingerprint(loading.resolve(model_path), "weights")


def label(model_path, out: Path, limit, tokens: int, continuations: int, max_new_tokens: int, seed: int,
          part: tuple[int, int] = (0, 1), futures: str = "both", together: int = 4) -> None:
    """Record GDN signals and utility labels of the labelling windows into ``out``
    (:func:`gatesight_learning.record.record_corpus`, its arguments), each shard tagged with the weights'
    fingerprint and the settings (the model's dtype among them); shards of other weights or settings in ``out``, a
    damaged one, and a ``together`` below 1, are refused before the model loads, a model without recurrent layers
    before any window is labelled."""
    check_together(together)
    if tokens < MIN_TOKENS:
        raise UsageError(f"--tokens {tokens}: give at least {MIN_TOKENS} tokens per window (a window may be cut to "
                         f"half, and the smallest fraction the labels are ranked by, {min(FRACTIONS):.0%}, of it must "
                         "hold a token)")
    weights = _weights(model_path)
    check_shards(sorted(out.glob(SHARD_FILES)), label_settings(weights, tokens, continuations, max_new_tokens,
                                                                    seed, futures, loading.dtype_name(model_path)))
    model, tokenizer, _ = loading.load(model_path)
    record_corpus(model, tokenizer, out, limit, tokens, continuations, max_new_tokens, seed, weights=weights,
                  part=part, futures=futures, together=together)


def _table(rows: dict[str, dict[str, float]]) -> str:
    keys = ["rho", "ov@5", "ov@10", "ov@20", "cov@5", "cov@10", "cov@20"]
    lines = ["| predictor | ρ | Ov@5 | Ov@10 | Ov@20 | Cov@5 | Cov@10 | Cov@20 |", "|---|" + "---|" * len(keys)]
    for name, metrics in rows.items():
        cells = [f"{metrics['rho']:+.3f}"] + [f"{100 * metrics[k]:.1f}" for k in keys[1:]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _evaluation_heading(scale: str) -> str:
    """What ``evaluation.md`` measures, naming the estimator's scale (:data:`presses.gatesight.SCALES`): the table is
    the same for both, ranked within each (layer, KV head), so a ``one`` estimator's ranking across layers (what it
    is trained for) is not in it."""
    across = "; its ranking across layers (--alloc global) is not measured here" if scale == "one" else ""
    return (f"# GateSight estimator on scale `{scale}`: leave-one-corpus-out evaluation\n\nEvery metric ranks the "
            f"entries within each (attention layer, KV head), then averages heads, windows and layers{across}.\n\n")


def train(model_path, labels_dir: Path, out: Path | None, slow_threshold: float, settings: TrainSettings,
          futures: str = "both", replace: bool = False) -> str:
    """Fit the estimator on the labels of ``futures`` (:func:`gatesight_learning.shards.load_shard`) on the scale of
    ``settings.scale`` (:mod:`gatesight_learning.estimator`), evaluate it and the heuristics leave-one-corpus-out,
    and save it with its record into ``out`` (default: the model's ``gatesight/``).

    An estimator already in ``out`` is refused before any work unless ``replace``; it is then moved aside to
    ``<out>.backup-<time>`` when the new one is saved (:func:`artifacts.files.install`).
    """
    from .analyze import observation_1, slow_heads_by_layer

    target = Path(out or loading.resolve(model_path) / ARTIFACT_DIR)
    check_replaceable(target, [target / name for name in ESTIMATOR_FILES], "a GateSight estimator", replace)
    weights = _weights(model_path)
    shards = _shards(labels_dir, weights, model_path, futures)
    _check_enough(shards, labels_dir, "train", model_path)
    training_targets(shards, settings.scale, labels_dir)  # shards without raw utilities refused before the model loads
    model, _, _ = loading.load(model_path)
    adapter = adapter_for(model)
    windows = {layer: gdn_window(adapter, layer, settings.window) for layer in adapter.attention_layers}
    slow = slow_heads_by_layer(observation_1(shards, model, slow_threshold)["slow"])
    rows = {}
    rows.update({name: evaluate(p, shards) for name, p in heuristic_predictors(windows, slow).items()})
    rows["single-head oracle (in-sample)"] = evaluate(single_head_oracle(shards, windows), shards)
    per_layer: dict = {}
    rows.update(learned_predictors_loco(shards, windows, settings, log=print, per_layer=per_layer))
    table = _table(rows)
    estimator = train_estimator(shards, windows, settings, log=print)
    seconds = [s["seconds"] for s in shards if s["seconds"] == s["seconds"]]  # NaN: shard without a timing
    estimator.meta.update({"weights": weights, "corpora": sorted({s["corpus"] for s in shards}), "futures": futures,
                           "label_seconds_per_window": sum(seconds) / len(seconds) if seconds else None,
                           "loco": rows,
                           "loco_per_layer": {name: {str(layer): m for layer, m in by_layer.items()}
                                              for name, by_layer in per_layer.items()},
                           "slow_threshold": slow_threshold})
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target) as scratch:  # each file written whole, then moved into place
        estimator.save(scratch)
        (Path(scratch) / "evaluation.md").write_text(_evaluation_heading(settings.scale) + table + "\n")
        install(sorted(Path(scratch).iterdir()), target)
    record_again(target.parent)  # where target is a recorded model's own gatesight/
    print(table)
    print(f"estimator saved to {target}")
    return table


def analyze(model_path, labels_dir: Path, out: Path, slow_threshold: float) -> None:
    """Write the paper's observations on this model into ``out``: ``observations.md`` (tables beside the paper's
    figures), ``observations.json`` and the half-life PNGs, each rebuilt whole (one edited or replaced by hand since
    the last run is first moved aside: :func:`artifacts.files.rebuilt_path`); observation 3 reads the model's
    GateSight artifact."""
    from .analyze import (
        PAPER,
        observation_1,
        observation_2,
        observation_3,
        plot_half_life_histogram,
        plot_half_lives,
        slow_heads_by_layer,
    )

    shards = _shards(labels_dir, _weights(model_path), model_path)
    _check_enough(shards, labels_dir, "analyze", model_path)
    model, _, directory = loading.load(model_path)
    adapter = adapter_for(model)
    out.mkdir(parents=True, exist_ok=True)
    windows = {layer: gdn_window(adapter, layer) for layer in adapter.attention_layers}
    obs1 = observation_1(shards, model, slow_threshold)
    with rebuilt_path(out / "half_lives.png") as scratch:
        plot_half_lives(obs1["medians"], slow_threshold, scratch)
    with rebuilt_path(out / "half_life_histogram.png") as scratch:
        plot_half_life_histogram(obs1["medians"], slow_threshold, scratch)
    obs2 = observation_2(shards, windows, slow_heads_by_layer(obs1["slow"]))
    lives = sorted(obs1["medians"].values())
    lines = [f"Documents: {len(shards)} held-out labelling windows. Paper: Qwen3.8-27B (§3, Table 1, Figure 2).", "",
             "## Observation 1: GDN memory dynamics", "", "| measure | this model | paper |", "|---|---|---|"]
    for key in ("median half-life", "pair spearman (median)", "pair spearman (min)", "static vs measured spearman",
                "slow heads", "heads", "slow-set jaccard (median)"):
        value, paper = obs1[key], PAPER.get(key, "–")
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        lines.append(f"| {key} | {shown} | {paper} |")
    lines += [f"| half-life 10th / 90th percentile (tokens) | {lives[len(lives) // 10]:.2f} / "
              f"{lives[(9 * len(lives)) // 10]:.2f} | a handful / hundreds to thousands |",
              f"| heads with half-life ≥ {slow_threshold:g} tokens | "
              f"{sum(v >= slow_threshold for v in lives) / len(lives):.1%} | – |"]
    names = sorted({k[1] for k in obs2["rho"]})
    lines += ["", "![half-lives per layer](half_lives.png) ![half-life histogram](half_life_histogram.png)", "",
              "## Observation 2: Spearman ρ of U with native signals", "",
              "| attention layer | " + " | ".join(names) + " |"]
    lines.append("|---|" + "---|" * len(names))
    for layer in windows:
        lines.append(f"| {layer} | " + " | ".join(f"{obs2['rho'][(layer, n)]:+.3f}" for n in names) + " |")
    lines.append("| paper (mean of 16 layers) | " + " | ".join(f"{PAPER['rho'].get(n, '–')}" for n in names) + " |")
    lines += ["", f"- slow-head β‖v‖ top-decile lift: {obs2['top-decile lift']:.2f}× (paper "
              f"{PAPER['top-decile lift']}×), bottom-decile lift: {obs2['bottom-decile lift']:.2f}× (paper "
              f"{PAPER['bottom-decile lift']}×)"]
    from presses.gatesight import GateSightEstimator

    try:
        obs3 = observation_3(GateSightEstimator.load(directory / ARTIFACT_DIR).meta)
    except (FileNotFoundError, ValueError) as error:
        obs3 = None
        lines += ["", f"## Observation 3: not available ({error})"]
    if obs3:
        lines += ["", "## Observation 3: a linear map against the MLP on the same features (leave-one-corpus-out)", "",
                  "| predictor | ρ | Ov@10 (%) | Cov@10 (%) | paper ρ / Ov@10 / Cov@10 |", "|---|---|---|---|---|"]
        for name, m in obs3["overall"].items():
            paper = " / ".join(str(x) for x in PAPER["table 1"][name])
            lines.append(f"| {name} | {m['rho']:+.3f} | {100 * m['ov@10']:.1f} | {100 * m['cov@10']:.1f} | {paper} |")
        ahead = obs3["layers ahead"]
        lines += ["", f"- the MLP is ahead of ridge in {ahead['ov@10']} of {obs3['layers']} attention layers on Ov@10, "
                  f"{ahead['cov@10']} on Cov@10 and {ahead['rho']} on ρ (paper: all 16 on Ov@10 and Cov@10)"]
    text = "\n".join(lines) + "\n"
    write_rebuilt(out / "observations.md", text)
    write_rebuilt(out / "observations.json", json.dumps(
        {k: v for k, v in obs1.items() if k not in ("medians", "slow")} | {"lift": [obs2["top-decile lift"],
                                                                                     obs2["bottom-decile lift"]]},
        indent=2))
    print(text)

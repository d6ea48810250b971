"""``bench label``, ``bench train``, ``bench analyze``, ``bench calibrate`` and ``bench calibrate-shares``: the flags
of GateSight's learning steps (:mod:`gatesight_learning.steps`), of the calibration
(:mod:`gatesight_learning.calibrate`) and of the head shares (:mod:`gatesight_learning.head_shares`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from allocators.head_shares import FILE as SHARES_FILE
from artifacts.output_kinds import ANALYSIS, ESTIMATOR, LABEL_SHARDS
from artifacts.outputs import DERIVED, RESULTS, Output
from gatesight_learning.calibrate import calibrate_model
from gatesight_learning.estimator import TrainSettings
from gatesight_learning.head_shares import KEEP_FRACTIONS, calibrate_head_shares
from gatesight_learning.steps import ESTIMATOR_FILES, analyze, label, train
from presses.calibration import FILE, LEGACY_FILE
from presses.gatesight import ARTIFACT_DIR, SCALES
from pretrained import loading

from .arguments import Command, add_model_arguments, count, kept_in, label_folder, model_spec, natural, part, positive


def add_label_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--out", default="results/labels",
                        help="the label shards' directory: a rerun (or another --part) adds the windows it lacks")
    parser.add_argument("--limit", type=count, default=None, help="at most this many documents (>= 1; default: all)")
    parser.add_argument("--tokens", type=count, default=1024, help="tokens per document window")
    parser.add_argument("--continuations", type=count, default=4)
    parser.add_argument("--max-new-tokens", type=count, default=128)
    parser.add_argument("--seed", type=natural, default=0)
    parser.add_argument("--futures", default="both", choices=["both", "labels"],
                        help="both: the sampled continuations and the reconstruction future; labels: the sampled "
                             "ones alone (the paper's recipe; about a third cheaper; train with --futures labels)")
    parser.add_argument("--part", type=part, default=(0, 1),
                        help="K/N: label windows K, K+N, … only, so N processes share the corpus (one --out)")
    parser.add_argument("--together", type=count, default=4,
                        help="windows labelled at once, their sampled futures decoded as one batch (decoding on a "
                             "CPU is bound by reading the weights: four windows at once take 0.54x the time a "
                             "window each on SmolLM2's hybrid)")


def run_label(args: argparse.Namespace) -> None:
    label(model_spec(args), Path(args.out), args.limit, args.tokens, args.continuations, args.max_new_tokens,
          args.seed, args.part, args.futures, args.together)


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--labels", type=label_folder, default="results/labels")
    parser.add_argument("--out", default=None, help="artifact directory (default: <model>/gatesight)")
    parser.add_argument("--epochs", type=count, default=12)
    parser.add_argument("--futures", default="both", choices=["labels", "reconstruction", "both"],
                        help="which utility labels to fit: both (default: the maximum of the two; measured better on "
                             "real text, docs/realtext.md), labels (the paper's recipe: sampled continuations only) or "
                             "reconstruction (the window asked back)")
    parser.add_argument("--slow-threshold", type=positive, default=64.0,
                        help="half-life (tokens) of a slow GDN head")
    parser.add_argument("--seed", type=natural, default=0)
    parser.add_argument("--scale", default="head", choices=SCALES,
                        help="head (default, the paper's): utilities relative to each (layer, KV head)'s largest, "
                             "ranked within a head; one: relative to one constant per document, in log space, so the "
                             "scores rank across layers (--alloc global); needs shards that record their scales")
    parser.add_argument("--replace", action="store_true",
                        help="--out holds an estimator: train a new one (the old one is moved aside to "
                             "<out>.backup-<time>); refused otherwise")


def model_folder(model: Path) -> Output:
    """The model directory itself, where a command that stores an artifact in it makes the artifact (a scratch
    folder), moves the old one aside and writes the folder's record again: a read-only one passed the check of the
    artifact's folder and failed after all the work, in a raw "[Errno 1]" (probe 10). The folder the model's name
    leads to: a model named by a link (which the bench takes) is written in where the link leads."""
    return Output(model.resolve(), "--model (where its new artifact is made, then renamed into place)", model=model)


def estimator_output(args: argparse.Namespace) -> Output:
    """Where ``bench train`` writes the estimator: ``--out``, else the model's own artifact folder (the one model
    directory it may lie in)."""
    model = loading.resolve(model_spec(args))
    target = Path(args.out) if args.out else model / ARTIFACT_DIR
    # realpath, not resolve(): a link loop given as --out is the output check's to name in one line, where
    # Path.resolve raised RuntimeError (probe 13)
    own = os.path.realpath(target) == os.path.realpath(model / ARTIFACT_DIR)
    return Output(target, "--out" if args.out else f"the {ARTIFACT_DIR}/ of --model", keeps=RESULTS,
                  held=tuple(target / name for name in ESTIMATOR_FILES), what="a GateSight estimator",
                  replace=args.replace, model=model if own else None, kind_of=ESTIMATOR)


def _with_model_folder(output: Output) -> list[Output]:
    """``output``, and the model directory where ``output`` is its own artifact folder (:func:`model_folder`)."""
    return [output] if output.model is None else [output, model_folder(output.model)]


def run_train(args: argparse.Namespace) -> None:
    train(model_spec(args), Path(args.labels), Path(args.out) if args.out else None, args.slow_threshold,
          TrainSettings(epochs=args.epochs, seed=args.seed, scale=args.scale), args.futures, args.replace)


def add_analyze_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--labels", type=label_folder, default="results/labels")
    parser.add_argument("--out", default="results/analysis",
                        help="where the tables and plots go; rebuilt from the labels on each run (a file of them "
                             "edited or replaced by hand since is first moved aside to <name>.backup-<time>)")
    parser.add_argument("--slow-threshold", type=positive, default=64.0)


def run_analyze(args: argparse.Namespace) -> None:
    analyze(model_spec(args), Path(args.labels), Path(args.out), args.slow_threshold)


LABEL = Command("label", "GateSight utility labels (Eq. 2) and GDN signals on held-out generic text",
                add_label_arguments, run_label,
                outputs=lambda args: [Output(Path(args.out), "--out", kind_of=LABEL_SHARDS)],
                interrupted=lambda args: kept_in(args.out, "the windows labelled are",
                                                 "run the same command again to resume"))
TRAIN = Command("train", "train the GateSight estimator (+ ridge, leave-one-corpus-out evaluation)",
                add_train_arguments, run_train, outputs=lambda args: _with_model_folder(estimator_output(args)),
                interrupted=lambda args: f"nothing was written: {estimator_output(args).path} holds what it held "
                                         "before (the estimator is saved whole once trained); it does not resume: "
                                         "run it again to start over")
ANALYZE = Command("analyze", "the paper's observations 1-2 on this model, tables and PNGs", add_analyze_arguments,
                  run_analyze, outputs=lambda args: [Output(Path(args.out), "--out", keeps=DERIVED,
                                                     kind_of=ANALYSIS)])


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--tokens", type=count, default=32768)
    parser.add_argument("--chunk", type=count, default=4096)
    parser.add_argument("--replace", action="store_true",
                        help="the model directory holds a calibration: measure a new one (the old one is moved "
                             "aside to calibration.backup-<time>); refused otherwise")


def run_calibrate(args: argparse.Namespace) -> None:
    result, path = calibrate_model(model_spec(args), args.tokens, args.chunk, args.replace)
    weights = ", ".join(f"{layer}: {w:.3f}" for layer, w in result.gate_weights.items())
    print(f"calibrated on {result.tokens} tokens -> {path}\nlayer gate weights: {weights}")


def calibration_output(args: argparse.Namespace) -> Output:
    """Where ``bench calibrate`` writes: the model's own calibration folder (older versions: a file at its root)."""
    model = loading.resolve(model_spec(args))
    return Output((model / FILE).parent, "the calibration folder of --model", keeps=RESULTS,
                  held=(model / FILE, model / LEGACY_FILE), what="a calibration", replace=args.replace, model=model)


CALIBRATE = Command("calibrate", "TriAttention query statistics and layer gate weights, stored with the model",
                    add_calibrate_arguments, run_calibrate,
                    outputs=lambda args: _with_model_folder(calibration_output(args)),
                    interrupted=lambda args: f"nothing was written: {calibration_output(args).path} holds what it "
                                             "held before (the calibration is saved whole once measured); it does "
                                             "not resume: run it again to start over")


def add_calibrate_shares_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--windows", type=count, default=14,
                        help="calibration windows, one a document, round-robin over the labelling sources (>= 2)")
    parser.add_argument("--tokens", type=count, default=2048, help="tokens per window, the chat prefix included")
    parser.add_argument("--replace", action="store_true",
                        help="the model directory holds head shares: calibrate new ones (the old file is moved "
                             "aside to calibration.backup-<time>); refused otherwise")


def run_calibrate_shares(args: argparse.Namespace) -> None:
    result, path = calibrate_head_shares(model_spec(args), args.windows, args.tokens, KEEP_FRACTIONS, args.replace)
    overall = result.provenance["stability"]["over windows (shares averaged over p)"]
    print(f"head shares from {args.windows} windows, at each p = {', '.join(map(str, KEEP_FRACTIONS))} -> {path}\n"
          f"Spearman between windows over {overall['pairs']} pairs: mean {overall['spearman_mean']:.3f}, "
          f"sd {overall['spearman_sd']:.3f}, min {overall['spearman_min']:.3f}, max {overall['spearman_max']:.3f}")


def shares_output(args: argparse.Namespace) -> Output:
    """Where ``bench calibrate-shares`` writes: the model's own calibration folder."""
    model = loading.resolve(model_spec(args))
    return Output((model / SHARES_FILE).parent, "the calibration folder of --model", keeps=RESULTS,
                  held=(model / SHARES_FILE,), what="head shares", replace=args.replace, model=model)


CALIBRATE_SHARES = Command(
    "calibrate-shares", "the head_shares allocator's shares per (layer, KV head), from KVzip's global allocations",
    add_calibrate_shares_arguments, run_calibrate_shares,
    outputs=lambda args: _with_model_folder(shares_output(args)),
    interrupted=lambda args: f"nothing was written: {shares_output(args).path} holds what it held before (the shares "
                             "are saved whole once measured); it does not resume: run it again to start over")

"""``bench calibrate``: TriAttention's query statistics and the layer gate weights, measured on the recording corpus
(:func:`gatesight_learning.record.recording_chunks`, the text the labels are recorded on) and stored with the model."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from tqdm import tqdm

from bench import loading
from bench.arguments import Command, add_model_arguments, model_spec
from bench.files import check_replaceable, install
from presses.calibration import FILE, LEGACY_FILE, Calibration, calibrate
from runtime.errors import UsageError

from .record import recording_chunks


def calibrate_model(model, tokens: int, chunk: int, replace: bool = False) -> tuple[Calibration, Path]:
    """Calibrate a model on the first ``tokens`` tokens of the recording corpus and store the result in its directory.

    Parameters
    ----------
    model : str, ModelSpec or None
        The model (:func:`bench.loading.load`).
    tokens : int
        Tokens measured, ≥ 1.
    chunk : int
        Tokens per prefilled sequence, ≥ 1.
    replace : bool
        Whether a calibration the model directory already holds may be replaced; it is then moved aside to
        ``calibration.backup-<time>`` beside the new one (:func:`bench.files.install`).

    Returns
    -------
    tuple[Calibration, Path]
        The calibration, and the file it was written to (whole, then moved into place: a reader never sees a part).

    Raises
    ------
    ValueError
        ``tokens`` or ``chunk`` below 1 (named by their flags), or a calibration already there without ``replace``,
        before the model loads.
    """
    for flag, value in (("--tokens", tokens), ("--chunk", chunk)):
        if value < 1:
            raise UsageError(f"{flag} {value}: give a positive number of tokens")
    directory = loading.resolve(model)
    target = (directory / FILE).parent
    held = [directory / FILE, directory / LEGACY_FILE]  # a root file of older versions is superseded too
    check_replaceable(target, held, "a calibration", replace)
    model, tokenizer, directory = loading.load(model)
    chunks, sources = recording_chunks(tokenizer, tokens, chunk)
    with tqdm(total=sum(c.numel() for c in chunks), unit="tok", desc="calibrate") as bar:
        result = calibrate(model, chunks, sources, progress=bar.update)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        [path] = install([result.save(Path(scratch))], target, superseded=held)
    return result, path


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--replace", action="store_true",
                        help="the model directory holds a calibration: measure a new one (the old one is moved "
                             "aside to calibration.backup-<time>); refused otherwise")


def run_calibrate(args: argparse.Namespace) -> None:
    result, path = calibrate_model(model_spec(args), args.tokens, args.chunk, args.replace)
    weights = ", ".join(f"{layer}: {w:.3f}" for layer, w in result.gate_weights.items())
    print(f"calibrated on {result.tokens} tokens -> {path}\nlayer gate weights: {weights}")


CALIBRATE = Command("calibrate", "TriAttention query statistics and layer gate weights, stored with the model",
                    add_calibrate_arguments, run_calibrate)

"""TriAttention's query statistics and the layer gate weights (``bench calibrate``), measured on the recording
corpus (:func:`gatesight_learning.record.recording_chunks`, the text the labels are recorded on) and stored with the
model."""

from __future__ import annotations

import tempfile
from pathlib import Path

from tqdm import tqdm

from artifacts.files import check_replaceable, install
from presses.calibration import FILE, LEGACY_FILE, Calibration, calibrate
from pretrained import loading
from pretrained.file_record import record_again
from pretrained.fingerprints import weights_fingerprint
from runtime.errors import UsageError

from .record import recording_chunks

MIN_TOKENS = 128
"""The fewest tokens a calibration reads: its centres and magnitudes are means over them."""


def calibrate_model(model, tokens: int, chunk: int, replace: bool = False) -> tuple[Calibration, Path]:
    """Calibrate a model on the first ``tokens`` tokens of the recording corpus and store the result in its directory.

    Parameters
    ----------
    model : str, ModelSpec or None
        The model (:func:`pretrained.loading.load`).
    tokens : int
        Tokens measured, ≥ 1.
    chunk : int
        Tokens per prefilled sequence, ≥ 1.
    replace : bool
        Whether a calibration the model directory already holds may be replaced; it is then moved aside to
        ``calibration.backup-<time>`` beside the new one (:func:`artifacts.files.install`).

    Returns
    -------
    tuple[Calibration, Path]
        The calibration, and the file it was written to (whole, then moved into place: a reader never sees a part).

    Raises
    ------
    ValueError
        ``tokens`` below :data:`MIN_TOKENS` or ``chunk`` below 1 (named by their flags), or a calibration already
        there without ``replace``, before the model loads; ``tokens`` beyond what the recording corpus holds, before
        calibrating.
    """
    for flag, value in (("--tokens", tokens), ("--chunk", chunk)):
        if value < 1:
            raise UsageError(f"{flag} {value}: give a positive number of tokens")
    if tokens < MIN_TOKENS:
        raise UsageError(f"--tokens {tokens}: give at least {MIN_TOKENS} (the calibration's statistics are means "
                         f"over the tokens read: over fewer, their error, about 1/sqrt(tokens) of a band's "
                         f"magnitude, passes 9 %)")
    directory = loading.resolve(model)
    target = (directory / FILE).parent
    held = [directory / FILE, directory / LEGACY_FILE]  # a root file of older versions is superseded too
    check_replaceable(target, held, "a calibration", replace)
    model, tokenizer, directory = loading.load(model)
    weights = weights_fingerprint(directory)  # the weights the calibration is measured on, as they were loaded
    chunks, sources = recording_chunks(tokenizer, tokens, chunk)
    held_tokens = sum(c.numel() for c in chunks)
    if held_tokens < tokens:  # before the hours of calibration, not in its last line
        raise UsageError(f"--tokens {tokens}: the recording corpus holds {held_tokens:,} tokens for this tokenizer; "
                         f"give --tokens {held_tokens} or fewer")
    with tqdm(total=sum(c.numel() for c in chunks), unit="tok", desc="calibrate") as bar:
        result = calibrate(model, chunks, sources, progress=bar.update)
    if result.weights != weights:  # a calibration of the loaded weights would be put beside others (probe 10)
        raise UsageError(f"{directory}: its weights changed while the calibration was measured (fingerprint {weights} "
                         f"as loaded, {result.weights} now): nothing was written; keep the weights as they are while "
                         f"`bench calibrate --model {directory}` runs, and run it again")
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        [path] = install([result.save(Path(scratch))], target, superseded=held)
    record_again(directory)
    return result, path

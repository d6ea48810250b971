"""``bench cost``: the paper's Table 2 analogue — scoring time per press against prefill time, by context length.

Each figure is the median of three runs after one warm-up. Contexts are generic text (repeated if short).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

import presses
from artifacts.files import install
from artifacts.output_kinds import COST_TABLE
from artifacts.outputs import RESULTS, Output, check
from presses.preparation import evidence_for, prepare
from presses.selection import Selection
from pretrained import loading
from runtime import EvidenceRequest, adapter_for, encode_text, prefill
from runtime.errors import UsageError
from workloads.corpus import SOURCES, documents

from .specs import press_name

TABLES = COST_TABLE.files
"""What ``bench cost`` writes into its ``--out``."""
ARTIFACT_COMMANDS = {"estimator": "`bench label --model {model} --out LABELS` then `bench train --model {model} "
                                  "--labels LABELS`",
                     "calibration": "`bench calibrate --model {model}`"}
"""What writes each artifact a press reads (``Press.artifact_files``, by its option) into the model's own folder."""


def median_seconds(fn, repeats: int = 3) -> float:
    """Median wall time of ``repeats`` calls of ``fn``, after one untimed warm-up call."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _score_seconds(parent, press, repeats: int = 3) -> float:
    """Median of ``repeats`` scorings' own time (:attr:`presses.Selection.score_seconds`: the checks that the press
    left the context and model as it found them are not the press's cost), after one untimed warm-up scoring."""
    Selection(parent, press).scores  # noqa: B018 - warm-up
    times = []
    for _ in range(repeats):
        selection = Selection(parent, press)
        selection.scores  # noqa: B018 - scored on first use
        times.append(selection.score_seconds)
    return statistics.median(times)


def _context(tokenizer, length: int) -> torch.Tensor:
    """``[length]`` token ids of held-out generic text, repeated when the documents are shorter."""
    text = "\n\n".join(text for source in SOURCES for _, text in documents(source, "heldout")[:5])
    ids = encode_text(tokenizer, text)
    while len(ids) < length:
        ids = ids + ids
    return torch.tensor(ids[:length])


def cost_output(out: Path, replace: bool = False) -> Output:
    """``--out``: the timings, a result never replaced unasked (:mod:`artifacts.outputs`)."""
    return Output(out, "--out", keeps=RESULTS, held=tuple(out / name for name in TABLES), what="a cost table",
                  replace=replace, kind_of=COST_TABLE)


def run_cost(model_path, press_names: list[str], lengths: list[int], out: Path, replace: bool = False) -> list[dict]:
    """Time each press's scoring against the prefill at each length; write ``cost.json`` and ``cost.md`` to ``out``.

    Parameters
    ----------
    model_path : str, ModelSpec or None
        The model (:func:`pretrained.loading.load`).
    press_names : list[str]
        Registry names (:func:`presses.get`).
    lengths : list[int]
        Context lengths in tokens, each in [2, the model's position limit].
    out : Path
        Where the table goes (:data:`TABLES`).
    replace : bool
        Whether a table already in ``out`` may be replaced (it is then moved aside to ``<out>.backup-<time>``).

    Returns
    -------
    list[dict]
        One row per (press, length): ``score_s``, ``prefill_s`` and ``prefill_multiple``, the scoring time as a
        multiple of the prefill's (``score_s / prefill_s``).

    Raises
    ------
    ValueError
        No press or length, an unknown press, a length out of range, an ``out`` that cannot be written or that holds a
        table without ``replace``: all before the model loads.
    """
    if not press_names or not lengths:
        raise UsageError(f"no {'press' if not press_names else 'length'} given (--"
                         f"{'press' if not press_names else 'lengths'}): give at least one press and one length")
    for name in press_names:
        if "[" in name:  # the registry's message speaks to a library caller; this is the command's
            raise UsageError(f"--press {name!r}: bench cost times each press with its default options; name it "
                             f"alone ({name.split('[', 1)[0]!r}) — options in brackets are bench compare's --press "
                             "syntax")
        presses.get(name)  # unknown names fail here, before the model loads
    settings = [press_name(name) for name in press_names]  # kvpress:knorm is kvpress:KnormPress
    twice = next((k for k, setting in enumerate(settings) if setting in settings[:k]), None)
    if twice is not None:
        first = press_names[settings.index(settings[twice])]
        raise UsageError(f"--press names one press twice: {first!r} and {press_names[twice]!r} (both are "
                         f"{settings[twice]}); give it once")
    info = loading.read(model_path)  # read once: its limit, its artifacts, the model and the presses' binding
    limit = info.position_limit
    bad = [n for n in lengths if n < 2 or (limit is not None and n > limit)]
    if bad:
        raise UsageError(f"length {bad[0]} is not allowed: lengths must be in [2, {limit}] tokens for this model")
    check([cost_output(out, replace)])
    _check_artifacts(press_names, info.directory)
    model, tokenizer, directory = loading.load(info)
    loading.check_artifacts(directory)
    adapter = adapter_for(model)
    built = {name: prepare(name, adapter, info) for name in press_names}
    evidence = evidence_for(built.values(), adapter)
    rows = []
    for length in lengths:
        context = _context(tokenizer, length)
        prefill_s = median_seconds(lambda: prefill(model, context, evidence=EvidenceRequest()).release())
        parent = prefill(model, context, evidence=evidence, tokenizer=tokenizer)
        for name, press in built.items():
            seconds = _score_seconds(parent, press)
            rows.append({"press": name, "length": length, "score_s": seconds, "prefill_s": prefill_s,
                         "prefill_multiple": seconds / prefill_s})
            print(f"{name:>13} n={length:>6}: scoring {seconds:8.4f} s, prefill {prefill_s:8.3f} s, "
                  f"scoring = {seconds / prefill_s:7.2%} of prefill", flush=True)
        parent.release()
    table = ["| press | " + " | ".join(f"{n} tok: score s (× prefill)" for n in lengths) + " |",
             "|---|" + "---|" * len(lengths)]
    for name in built:
        cells = [next(r for r in rows if r["press"] == name and r["length"] == n) for n in lengths]
        table.append(f"| {name} | " + " | ".join(f"{c['score_s']:.4f} ({c['prefill_multiple']:.1%})" for c in cells)
                     + " |")
    prefills = [next(r for r in rows if r["length"] == n)["prefill_s"] for n in lengths]
    table.append("| prefill | " + " | ".join(f"{p:.3f}" for p in prefills) + " |")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out) as scratch:  # both files whole, then moved in (the old ones aside)
        (Path(scratch) / "cost.json").write_text(json.dumps(rows, indent=2))
        (Path(scratch) / "cost.md").write_text("\n".join(table) + "\n")
        install(sorted(Path(scratch).iterdir()), out)
    print("\n".join(table))
    return rows


def _check_artifacts(press_names: list[str], directory: Path) -> None:
    """A :class:`~runtime.errors.UsageError` before the model loads for a press whose artifact (GateSight's estimator,
    TriAttention's calibration) the model's folder ``directory`` lacks: cost takes no press options, so it reads
    them from there alone, and the advice says what writes them there."""
    for name in press_names:
        reads = presses.PRESSES[name].artifact_files if name in presses.PRESSES else {}
        for option, (folder, patterns) in reads.items():
            if not any(path.is_file() for pattern in patterns for path in (directory / folder).glob(pattern)):
                raise UsageError(f"--press {name}: bench cost times it with its default options, which read its "
                                 f"{option} from the model's own folder, {(directory / folder).resolve()}, and none "
                                 f"is there; write one there first: "
                                 f"{ARTIFACT_COMMANDS[option].format(model=directory)}")

"""Full-cache accuracy of a model on held-out task items (the default model's card table)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from statistics import mean
from typing import NamedTuple

import torch

from artifacts.files import write_result, write_text
from artifacts.outputs import FILE, RESULTS, Output, check
from pretrained import loading
from pretrained.model_fault import model_fault
from runtime import encode_text, prefill
from runtime.bounded_read import REPORT_LIMIT, read_bounded
from runtime.errors import UsageError
from runtime.json_text import parse_json
from workloads.metrics import METRICS
from workloads.tasks import Config, generate

from ..store.legacy_rows import read_row
from ..store.row_fields import RUN, check_items


@torch.no_grad()
def bits_per_byte(model, tokenizer, documents_per_source: int = 10, window: int = 1024) -> dict[str, float]:
    """Bits per byte on the first ``window`` bytes of held-out generic documents, per source."""
    from workloads.corpus import SOURCES, documents

    out = {}
    for source in SOURCES:
        nats, count = 0.0, 0
        for _, text in documents(source, "heldout")[:documents_per_source]:
            ids = torch.tensor(encode_text(tokenizer, text)[:window])[None]
            logits = model(ids).logits[0, :-1].float()
            nats += float(torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum"))
            count += ids.shape[1] - 1
        out[source] = nats / count / math.log(2)
    return out


ROW_FIELDS = ("model", "weights", "press", "allocator", "keep_fraction", "task", "item", "question", "score")
"""The fields of each row of an evaluation: one JSON line per answered question."""


def rows_output(path: Path, replace: bool = False) -> Output:
    """``--rows``: the rows of an evaluation, a result never replaced unasked, and a file of other rows never
    replaced (:mod:`artifacts.outputs`)."""
    return Output(path, "--rows", FILE, RESULTS, what="the rows of a model evaluation", replace=replace,
                  foreign=not_evaluation_rows)


def not_evaluation_rows(path: Path) -> str | None:
    """What the file ``path`` is when it is not the rows of a model evaluation (each line a JSON object of
    :data:`ROW_FIELDS`): a ``bench compare`` (or ``bench merge``) result store, or another file; None for the rows of
    an evaluation or an empty file."""
    other = "never replaced, with --replace or not; give --rows a file of its own"
    try:
        lines = read_bounded(path, REPORT_LIMIT, "move it away, or give --rows a file of its own").decode(
            "utf-8").splitlines()
    except UnicodeDecodeError:
        return f"is not text, not the rows of a model evaluation: {other}"
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = parse_json(line)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict) and set(value) == set(ROW_FIELDS):
            continue
        if isinstance(value, dict) and read_row(dict(value)) is not None:
            record = " and a run record" if RUN in value else ""
            return (f"is a bench compare result store (line {number} is one of its rows: press, allocator and "
                    f"keep_fraction fields{record}), not the rows of a model evaluation: {other}")
        return f"line {number} is not a row of a model evaluation ({', '.join(ROW_FIELDS)}): {other}"
    return None


class Evaluation(NamedTuple):
    """What :func:`evaluate_model` measured (:func:`bench.reports.model_card.accuracy_markdown` tables it)."""

    rows: list[dict]
    """One per answered question, of :data:`ROW_FIELDS`; its ``task`` is ``<task>@<length>``."""
    tasks: list[str]
    """The tasks answered, groups expanded, in order."""
    lengths: list[int]
    n: int
    """Items per task and length."""
    bits_per_byte: dict[str, float]
    """Held-out generic text's bits per byte, by source (:func:`bits_per_byte`)."""


def evaluate_model(model_path, tasks: list[str], lengths: list[int], n: int, seed: int = 0,
                   rows_out: Path | None = None, replace: bool = False) -> Evaluation:
    """Full-cache accuracy per task and length, no eviction, greedy; items = evaluation seeds; each task's
    accuracy printed as it finishes. ``rows_out``: one JSON line per item (for paired comparisons of models),
    written as each task finishes (an interrupted run keeps the finished tasks' rows); a file already there is
    refused before any work unless ``replace``, and then moved aside when the first rows are written."""
    from workloads.tasks import TASKS
    from workloads.tasks.registry import GROUPS, expand

    if rows_out is not None:
        check([rows_output(rows_out, replace)])
    check_items(n)
    if not tasks or not lengths:
        raise UsageError(f"no {'task' if not tasks else 'length'} given (--{'tasks' if not tasks else 'lengths'}): "
                         "give at least one task and one length")
    groups = [name for name, members in GROUPS.items() if set(members) <= set(TASKS)]
    unknown = [task for task in tasks if task not in TASKS and task not in groups]
    if unknown:
        raise UsageError(f"--tasks {unknown[0]!r}: model-eval answers the generated tasks {', '.join(TASKS)} (or the "
                         f"groups {', '.join(groups)})")
    tasks = expand(tasks)  # a task named twice, as a length given twice, is refused
    limit = loading.position_limit(model_path)
    bad = [length for length in lengths if length < 1 or (limit is not None and length > limit)]
    if bad:
        raise UsageError(f"length {bad[0]} is not allowed: lengths must be in [1, {limit}] tokens for this model")
    model, tokenizer, directory = loading.load(model_path)
    rows: list[dict] = []
    written, aside = False, None
    encode = lambda text: torch.tensor(encode_text(tokenizer, text))  # noqa: E731
    count = lambda text: len(encode_text(tokenizer, text))  # noqa: E731
    table: dict[tuple[str, int], float] = {}
    misfits: dict[str, tuple[int, ValueError]] = {}
    for length, task in ((length, task) for length in lengths for task in tasks):
        try:  # every task's first item before any is answered: one that cannot fit its length says so at once
            generate(task, 0, seed, Config(length=length, count_tokens=count))
        except ValueError as error:
            misfits.setdefault(task, (length, error))
    if misfits:
        task, (length, error) = next(iter(misfits.items()))
        fit = [t for t in tasks if t not in misfits]
        advice = (f"; leave out {', '.join(misfits)}: --tasks {','.join(fit)} fit every length given" if fit else
                  "; give longer --lengths")
        raise UsageError(f"task {task!r} at length {length}: {error}{advice}")
    # held-out text first: a model whose numbers are not finite is refused before any row is written (probe 29, #2)
    bits = bits_per_byte(model, tokenizer)
    damaged = [source for source, value in bits.items() if not math.isfinite(value)]
    if damaged:  # a figure no model gives: printed as a measurement, it read as a weak model
        raise UsageError(model_fault(f"NaN or infinite bits per byte on the held-out {damaged[0]} text", directory,
                                     next(model.parameters()).dtype))
    try:
        for length in lengths:
            cfg = Config(length=length, count_tokens=count)
            for task in tasks:
                for index in range(n):
                    item = generate(task, index, seed, cfg)
                    parent = prefill(model, encode(item.context), tokenizer=tokenizer)
                    _check_finite(parent.last_logits, f"after its own prefill of {task} item {index}", parent,
                                  directory)
                    for number, q in enumerate(item.questions):
                        question = encode(q.prompt)
                        answer = parent.answer(question, q.max_new_tokens, tokenizer.eos_token_id)
                        # the logits each answer token was chosen from: NaN may come with the question's tokens or
                        # the answer's own, and greedy decoding of NaN scores 0, as a weak model (probe 29, #1)
                        chosen = parent.logits(torch.cat([question, question.new_tensor(answer.tokens[:-1])]))
                        _check_finite(chosen, f"while answering {task} item {index}", parent, directory)
                        rows.append({"model": directory.name,
                                     "weights": loading.fingerprint(directory, "weights"),
                                     "press": "none", "allocator": "none", "keep_fraction": 1.0,
                                     "task": f"{task}@{length}", "item": index, "question": number,
                                     "score": METRICS[item.metric](answer.text, q.answers)})
                    parent.release()
                table[(task, length)] = 100 * mean(r["score"] for r in rows if r["task"] == f"{task}@{length}")
                print(f"{task:>16} @ {length}: {table[(task, length)]:.1f}", flush=True)
                if rows_out is not None:  # each task's rows as it finishes, so that an interrupted run keeps them
                    text = "".join(json.dumps(r) + "\n" for r in rows)
                    if written:  # this run's rows so far, written over whole
                        write_text(rows_out, text)
                    else:  # an earlier evaluation's rows (--replace) are moved aside first
                        aside = write_result(rows_out, text)
                        written = True
    except _DamagedModel as fault:  # rows of a damaged model are no measurement: this run's own file goes
        if written and aside is not None:  # the evaluation's rows it replaced are put back
            os.replace(aside, rows_out)
        elif written:
            rows_out.unlink()
        undone = ("" if not written else f"; the rows this run wrote to {rows_out} were removed"
                  + (", the previous ones put back" if rows_out.exists() else ""))
        raise UsageError(f"{fault}{undone}") from None
    return Evaluation(rows, tasks, lengths, n, bits)


class _DamagedModel(Exception):
    """Numbers of the model itself that are not finite (:func:`pretrained.model_fault.model_fault` says it)."""


def _check_finite(logits: torch.Tensor, when: str, parent, directory: Path) -> None:
    """A :class:`_DamagedModel` unless every one of ``logits`` (``[..., V]``, of ``parent``'s model, ``when``: where
    in the evaluation) is finite."""
    if not bool(logits.isfinite().all()):
        raise _DamagedModel(model_fault(f"NaN or infinite logits {when}", directory, parent.adapter.dtype))

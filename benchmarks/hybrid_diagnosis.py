"""Where the distilled hybrid loses the needle: attention, residual stream and answer likelihood of the teacher and
of the hybrid on the same NIAH questions (issue 48, "diagnose before training more").

Three models read the same token ids: the teacher (SmolLM2-135M-Instruct), the hybrid (``smollm2-135m-hybrid``:
full attention at 7, 8, 14, 17, 18, 20, 21, 23, Gated DeltaNet elsewhere) and ``split``, the teacher with every
layer but the hybrid's attention layers limited to a 128-token window (+ 4 sink tokens): the layer-split proxy of
``benchmarks/teacher_layer_split.py``. Two sets of questions, on the manual-page haystack at 2,048 tokens:

* ``bench``: the first question of items 0..n-1 of niah_single_2 and niah_multikey_1, exactly as ``bench compare``
  frames them (ChatML; the answer prefix, then the reference answer teacher-forced);
* ``moved``: the single needle of niah_single_2 item i, moved to d tokens before the question's last token, asked
  in ChatML and as plain continuation text (no chat template: ``header, body, "The magic number for KEY is"``).

For every question and model: the reference answer's NLL per token and whether greedy decoding reproduces it
(the argmax at every answer position is the reference token); per attention layer and head, the attention mass the
question's last token (the one predicting the answer's first token) puts on the needle's value tokens; per layer,
the residual stream's cosine to the teacher's at the value tokens, at the question's last token and averaged over
every position. On ``bench``, the kept attention layers are also swapped: each model's attention layer reads the
other model's residual stream, which tells features the upstream layers wrote from what the attention layer does
with them.

    OMP_NUM_THREADS=1 python benchmarks/hybrid_diagnosis.py run --out docs/hybrid/diagnosis/rows.jsonl
    python benchmarks/hybrid_diagnosis.py report --rows docs/hybrid/diagnosis/rows.jsonl.gz --out docs/hybrid/diagnosis

``run`` appends one row per question to ``--out`` as it goes and resumes there. The write-up, its cost and the
numbers: ``docs/hybrid/diagnosis.md``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from teacher_layer_split import window_hooks

from bench.fidelity import reference_text
from bench.needles import needle_positions
from pretrained import loading
from runtime import encode_text
from runtime.errors import UsageError
from workloads.tasks import Config, generate
from workloads.tasks.items import CONTEXT_TEMPLATE, Item, Question

TEACHER, HYBRID = "smollm2-135m-instruct", "smollm2-135m-hybrid"
MODELS = ("teacher", "hybrid", "split")
"""The teacher, the hybrid, and the teacher limited to a local window outside the hybrid's attention layers."""
FORMATS = ("chatml", "plain")
BENCH_TASKS = ("niah_single_2", "niah_multikey_1")
MOVED_TASK = "niah_single_2"


# ---- questions ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Probe:
    """One question as every model reads it.

    Attributes
    ----------
    ids : list[int]
        ``[L]`` the context, then the question; the last id predicts the answer's first token.
    answer : list[int]
        ``[A]`` the reference answer, teacher-forced after ``ids``.
    value : list[int]
        Positions in ``ids`` of the needle's value tokens (the answer's string inside the needle sentence).
    """

    ids: list[int]
    answer: list[int]
    value: list[int]

    @property
    def distance(self) -> int:
        """Tokens from the needle's first value token to the question's last token."""
        return len(self.ids) - 1 - self.value[0]


def probe(tokenizer, item: Item, question: Question, body: str, form: str) -> Probe:
    """``question`` about ``item`` with haystack ``body``, framed as the bench frames it (``chatml``: the item's
    context, then the question, the end of the turn and the answer prefix) or as plain text (``plain``: the header,
    the body, then the answer prefix alone, stripped)."""
    encode = partial(encode_text, tokenizer)
    if form == "chatml":
        context, prompt = CONTEXT_TEMPLATE.format(header=item.header, body=body), question.prompt
    elif form == "plain":
        context, prompt = f"{item.header}\n\n{body}\n\n", question.prefix.strip()
    else:
        raise UsageError(f"unknown question format {form!r}; choose {', '.join(FORMATS)}")
    value = needle_positions(encode, context, question.needles[:1], question.answers[:1]).tolist()
    return Probe(encode(context) + encode(prompt), encode(reference_text(prompt, question.answers[0])), value)


def without_needle(body: str, needle: str) -> str:
    """``body`` with the sentence ``needle`` taken out, and the one separator character after it (before it, if it
    ends the body): a haystack is sentences joined by one space or newline, the needle one of them. ``ValueError``
    unless it occurs exactly once."""
    if body.count(needle) != 1:
        raise ValueError(f"the needle {needle!r} occurs {body.count(needle)} times in the haystack; expected once")
    before, after = body.split(needle)
    return before + after[1:] if after else before[:-1]


def sentence_starts(body: str) -> list[int]:
    """Offsets in ``body`` where a sentence starts (after ``.``, ``!`` or ``?`` and whitespace), and its end."""
    return [0] + [match.end() for match in re.finditer(r"(?<=[.!?])\s+", body)] + [len(body)]


def insert_needle(body: str, needle: str, start: int) -> str:
    """``needle`` inserted as a sentence at offset ``start`` of ``body`` (one of :func:`sentence_starts`)."""
    if start == len(body):
        return f"{body} {needle}" if body else needle
    return f"{body[:start]}{needle} {body[start:]}"


def placed(tokenizer, item: Item, question: Question, form: str, distance: int) -> Probe:
    """The probe whose needle sits at the sentence boundary nearest to ``distance`` tokens before the question's
    last token (the rest of the haystack unchanged, in order)."""
    needle = question.needles[0]
    rest = without_needle(item.body, needle)
    starts = sentence_starts(rest)
    at = lambda i: probe(tokenizer, item, question, insert_needle(rest, needle, starts[i]), form)  # noqa: E731
    low, high = 0, len(starts) - 1  # the distance falls as the needle moves later: the first index at or below
    while low < high:
        middle = (low + high) // 2
        low, high = (middle + 1, high) if at(middle).distance > distance else (low, middle)
    candidates = [at(i) for i in {max(low - 1, 0), low}]
    return min(candidates, key=lambda p: abs(p.distance - distance))


# ---- what a model computes -------------------------------------------------------------------------------------------
def attention_layers(model) -> list[int]:
    """Indices of the decoder layers with softmax attention (``self_attn``)."""
    return [i for i, layer in enumerate(model.model.layers) if hasattr(layer, "self_attn")]


class Taps:
    """Forward hooks on a causal LM's decoder layers: the residual stream after every layer while ``recording``, and
    the last query's attention probabilities at every attention layer while ``looking`` (eager attention: SDPA
    returns none)."""

    def __init__(self, model):
        self.recording = self.looking = False
        self.streams: list[list[torch.Tensor]] = [[] for _ in model.model.layers]  # per layer, [T, D] chunks
        self.rows: dict[int, torch.Tensor] = {}  # attention layer -> [H, K]
        self.handles = []
        for index, layer in enumerate(model.model.layers):
            self.handles.append(layer.register_forward_hook(partial(self._stream, index)))
            if hasattr(layer, "self_attn"):
                self.handles.append(layer.self_attn.register_forward_hook(partial(self._row, index)))

    def _stream(self, index, module, args, output):
        if self.recording:
            self.streams[index].append((output[0] if isinstance(output, tuple) else output)[0])

    def _row(self, index, module, args, output):
        if self.looking:
            self.rows[index] = output[1][0, :, -1]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


@dataclass
class Reading:
    """What one model computes on one :class:`Probe`.

    Attributes
    ----------
    log_probs : torch.Tensor
        ``[A, V]`` float32 next-token log-probabilities at the answer's positions.
    mass : dict[int, torch.Tensor]
        Attention layer -> ``[H]`` the probability mass the question's last token puts on the needle's value tokens.
    stream : torch.Tensor
        ``[layers, L, D]`` the residual stream after every decoder layer at every position of ``ids``.
    """

    log_probs: torch.Tensor
    mass: dict[int, torch.Tensor]
    stream: torch.Tensor

    def nll(self, answer: list[int]) -> list[float]:
        return [-float(self.log_probs[i, token]) for i, token in enumerate(answer)]

    def greedy(self) -> list[int]:
        return self.log_probs.argmax(-1).tolist()


@contextmanager
def attention_implementation(model, name: str):
    former = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(former)


@torch.no_grad()
def read(model, probe: Probe) -> Reading:
    """The model's :class:`Reading` of ``probe``: the context and question but the last token in one pass (SDPA),
    then the question's last token (eager, for its attention probabilities) and the answer but its last token one
    at a time. transformers 5.2 continues a GDN layer's cache only one token at a time (``runtime/gdn.py``), so
    every token after the first pass goes alone, for the teacher as for the hybrid."""
    ids = torch.tensor(probe.ids)[None]
    taps = Taps(model)
    try:
        taps.recording = True
        with attention_implementation(model, "sdpa"):
            cache = model(ids[:, :-1], use_cache=True, logits_to_keep=1).past_key_values
        with attention_implementation(model, "eager"):
            taps.looking = True
            logits = [model(ids[:, -1:], past_key_values=cache, use_cache=True).logits[0, -1]]
            taps.recording = taps.looking = False
            for token in probe.answer[:-1]:
                logits.append(model(torch.tensor([[token]]), past_key_values=cache, use_cache=True).logits[0, -1])
    finally:
        taps.remove()
    value = torch.tensor(probe.value)
    return Reading(torch.stack(logits).float().log_softmax(-1),
                   {layer: row[:, value].sum(-1) for layer, row in taps.rows.items()},
                   torch.stack([torch.cat(chunks) for chunks in taps.streams]))


@torch.no_grad()
def last_query_mass(model, layer: int, stream: torch.Tensor, value: list[int]) -> torch.Tensor:
    """``[H]`` attention mass of the last position on ``value`` at ``model``'s attention layer ``layer``, computed by
    the layer's own modules from the residual stream ``stream`` ``[L, D]`` entering it — another model's, to swap
    them. The last query attends to every position, so no mask is needed for it."""
    block = model.model.layers[layer]
    hidden = block.input_layernorm(stream[None])
    rotary = model.model.rotary_emb(hidden, torch.arange(stream.shape[0])[None])
    with attention_implementation(model, "eager"):
        _, weights = block.self_attn(hidden, position_embeddings=rotary, attention_mask=None)
    return weights[0, :, -1, value].sum(-1)


def stream_cosines(stream: torch.Tensor, reference: torch.Tensor, value: list[int]) -> dict[str, list[float]]:
    """Per layer, the cosine of ``stream`` to ``reference`` (both ``[layers, L, D]``): averaged over the value
    tokens, at the last position, and averaged over every position."""
    cosine = F.cosine_similarity(stream, reference, dim=-1)  # [layers, L]
    return {"cos_value": cosine[:, value].mean(-1).tolist(), "cos_last": cosine[:, -1].tolist(),
            "cos_all": cosine.mean(-1).tolist()}


# ---- intervals ------------------------------------------------------------------------------------------------------
def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval (95 % by default) of a proportion ``successes / n``."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"wilson: need 0 <= successes <= n and n >= 1, got {successes} of {n}")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_mean(values, resamples: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (paired differences: pass the differences)."""
    values = np.asarray(values, dtype=float)
    if values.size < 1:
        raise ValueError("bootstrap_mean: no values")
    draws = np.random.default_rng(seed).integers(0, values.size, (resamples, values.size))
    means = values[draws].mean(1)
    return float(np.quantile(means, (1 - level) / 2)), float(np.quantile(means, (1 + level) / 2))


# ---- the run --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cell:
    """One question of the run: which set, task, item and format, and the needle's target distance (None: where
    the task put it)."""

    set: str
    task: str
    item: int
    form: str
    target: int | None

    @property
    def key(self) -> str:
        return f"{self.set}/{self.task}/{self.item}/{self.form}/{self.target}"


def cells(bench: int, moved: int, distances: list[int], plain: list[int]) -> list[Cell]:
    """The bench set (both tasks, items 0..bench-1), then the moved set context by context (items 0..moved-1 of
    niah_single_2, every ChatML distance, then every plain one)."""
    out = [Cell("bench", task, i, "chatml", None) for task in BENCH_TASKS for i in range(bench)]
    for i in range(moved):
        out += [Cell("moved", MOVED_TASK, i, "chatml", d) for d in distances]
        out += [Cell("moved", MOVED_TASK, i, "plain", d) for d in plain]
    return out


def done_keys(path: Path, settings: dict) -> set[str]:
    """Keys of the rows already in ``path``; a row of other settings, or a line that is not JSON, is refused."""
    keys = set()
    if not path.exists():
        return keys
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise UsageError(f"{path}:{number}: not a JSON row (an interrupted write?); remove that line to "
                             "resume") from None
        if row.get("settings") != settings:
            raise UsageError(f"{path}:{number}: a row of other settings ({row.get('settings')}); these are "
                             f"{settings}: write to another --out")
        keys.add(row["key"])
    return keys


def run(args) -> None:
    distances, plain = _distances(args.distances, args.length), _distances(args.plain_distances, args.length)
    if args.bench < 0 or args.moved < 0:
        raise UsageError(f"--bench and --moved count items: got {args.bench} and {args.moved}; use 0 or more")
    settings = {"length": args.length, "haystack": args.haystack, "window": args.window, "sink": args.sink,
                "teacher": TEACHER, "hybrid": HYBRID}
    done = done_keys(args.out, settings)
    todo = [c for c in cells(args.bench, args.moved, distances, plain) if c.key not in done][: args.limit]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(f"{len(todo)} questions to measure into {args.out}", flush=True)
    if not todo:
        return
    torch.manual_seed(0)
    teacher, tokenizer, _ = loading.load(TEACHER)
    hybrid, hybrid_tokenizer, _ = loading.load(HYBRID)
    if hybrid_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise UsageError(f"{HYBRID} and {TEACHER} have different tokenizers: they cannot read the same ids")
    kept = attention_layers(hybrid)
    config = Config(length=args.length, count_tokens=lambda text: len(encode_text(tokenizer, text)),
                    haystack=args.haystack)
    for cell in todo:
        began, cpu = time.time(), time.process_time()
        item = generate(cell.task, cell.item, 0, config)
        question = item.questions[0]
        p = (probe(tokenizer, item, question, item.body, cell.form) if cell.target is None
             else placed(tokenizer, item, question, cell.form, cell.target))
        row = {"key": cell.key, "settings": settings, "set": cell.set, "task": cell.task, "item": cell.item,
               "format": cell.form, "target": cell.target, "distance": p.distance, "n_tokens": len(p.ids),
               "answer": question.answers[0], "answer_ids": p.answer, "value": p.value, "models": {}}
        readings = {}
        for name in MODELS:
            start = time.time()
            if name == "split":
                handles = window_hooks(teacher, set(kept), args.window, args.sink)
                try:
                    readings[name] = read(teacher, p)
                finally:
                    for handle in handles:
                        handle.remove()
            else:
                readings[name] = read(teacher if name == "teacher" else hybrid, p)
            reading = readings[name]
            greedy = reading.greedy()
            fields = {"nll": _rounded(reading.nll(p.answer)), "greedy": greedy, "exact": greedy == p.answer,
                      "greedy_text": tokenizer.decode(greedy),
                      "mass": {str(layer): _rounded(m.tolist()) for layer, m in reading.mass.items()}}
            if name != "teacher":
                cosines = stream_cosines(reading.stream, readings["teacher"].stream, p.value)
                fields.update({field: _rounded(values) for field, values in cosines.items()})
            row["models"][name] = {**fields, "seconds": round(time.time() - start, 2)}
        if cell.set == "bench" and args.swap:
            start = time.time()
            # the stream entering layer l is the one after layer l - 1 (every kept layer is past layer 0)
            row["swap"] = {
                "teacher stream, hybrid layer": {str(layer): _rounded(last_query_mass(
                    hybrid, layer, readings["teacher"].stream[layer - 1], p.value).tolist()) for layer in kept},
                "hybrid stream, teacher layer": {str(layer): _rounded(last_query_mass(
                    teacher, layer, readings["hybrid"].stream[layer - 1], p.value).tolist()) for layer in kept}}
            row["swap_seconds"] = round(time.time() - start, 2)
        row["seconds"], row["cpu_seconds"] = round(time.time() - began, 2), round(time.process_time() - cpu, 2)
        with args.out.open("a") as file:
            file.write(json.dumps(row) + "\n")
        nll = "  ".join(f"{name} {sum(row['models'][name]['nll']):5.2f}{'*' if row['models'][name]['exact'] else ' '}"
                        for name in MODELS)
        print(f"{cell.key:<40} d={p.distance:<5} {nll}  {row['seconds']:.0f} s", flush=True)


def _rounded(values: list[float]) -> list[float]:
    return [round(v, 5) for v in values]  # the rows stay small; far below every difference the report reads


def _distances(text: str, length: int) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"distances must be a comma list of whole token counts, got {text!r}") from None
    bad = [v for v in values if not 0 < v < length]
    if bad or not values:
        raise UsageError(f"distances {bad or text!r} do not fit a context of {length} tokens: use 1 to {length - 1} "
                         "(the needle goes to the sentence boundary nearest each)")
    return values


# ---- the report -----------------------------------------------------------------------------------------------------
def _mean_interval(values) -> dict:
    low, high = bootstrap_mean(values)
    return {"mean": float(np.mean(values)), "low": low, "high": high, "n": len(values)}


def _accuracy(flags) -> dict:
    low, high = wilson(sum(flags), len(flags))
    return {"accuracy": sum(flags) / len(flags), "low": low, "high": high, "n": len(flags)}


def _bench_reference(path: Path | None) -> dict:
    """``{(task, item): (score, answer_nll)}`` of the first question of each item in a ``bench compare`` store."""
    if path is None:
        return {}
    return {(r["task"], r["item"]): (r["score"], r["answer_nll"]) for r in _rows(path)
            if r.get("question") == 0 and r.get("press") in (None, "none")}


def _rows(path: Path) -> list[dict]:
    """The JSON rows of a JSONL file, gzipped (``.gz``) or not."""
    with gzip.open(path, "rt") if path.suffix == ".gz" else path.open() as file:
        return [json.loads(line) for line in file]


def _nll(row: dict, model: str) -> float:
    return sum(row["models"][model]["nll"])


def _kept_mass(row: dict, model: str, kept: list[int]) -> float:
    """The largest needle mass of any head of the kept attention layers."""
    return max(max(row["models"][model]["mass"][str(layer)]) for layer in kept)


def _set_summary(rows: list[dict], models: list[str], kept: list[int]) -> dict:
    """Accuracy, answer NLL (and per answer token), the kept layers' largest needle mass, by model."""
    out = {}
    for m in models:
        right = [_kept_mass(r, m, kept) for r in rows if r["models"][m]["exact"]]
        wrong = [_kept_mass(r, m, kept) for r in rows if not r["models"][m]["exact"]]
        out[m] = {"accuracy": _accuracy([r["models"][m]["exact"] for r in rows]),
                  "answer_nll": _mean_interval([_nll(r, m) for r in rows]),
                  "nll_by_token": np.mean([r["models"][m]["nll"] for r in rows], 0).tolist(),
                  "kept_mass": _mean_interval([_kept_mass(r, m, kept) for r in rows]),
                  "kept_mass_right": float(np.mean(right)) if right else None,
                  "kept_mass_wrong": float(np.mean(wrong)) if wrong else None}
    return out


def _paired(first: list[dict], second: list[dict], key) -> list[tuple[dict, dict]]:
    """Rows of ``first`` and ``second`` with the same ``key(row)``, side by side."""
    other = {key(r): r for r in second}
    return [(r, other[key(r)]) for r in first if key(r) in other]


def summarise(rows: list[dict], references: dict[str, Path | None]) -> dict:
    """Every number of the write-up from the rows of :func:`run`, and the check against ``bench compare``'s rows on
    the same questions (``references``: model -> its rows file)."""
    models = [m for m in MODELS if all(m in r["models"] for r in rows)]
    kept = sorted(int(k) for k in rows[0]["models"]["hybrid"]["mass"])
    bench = [r for r in rows if r["set"] == "bench"]
    moved = [r for r in rows if r["set"] == "moved"]
    out: dict = {"questions": len(rows), "kept_layers": kept,
                 "cpu_hours": sum(r["cpu_seconds"] for r in rows) / 3600,
                 "wall_hours": sum(r["seconds"] for r in rows) / 3600}
    if bench:
        out["bench"] = _set_summary(bench, models, kept)
        out["bench"]["distance"] = {"min": min(r["distance"] for r in bench), "max": max(r["distance"] for r in bench)}
        for m, path in references.items():
            reference = _bench_reference(path)
            pairs = [(r, reference[(r["task"], r["item"])]) for r in bench if (r["task"], r["item"]) in reference]
            if pairs:
                out["bench"][m]["bench_rows"] = {
                    "n": len(pairs), "score": sum(score for _, (score, _) in pairs) / len(pairs),
                    "max_abs_nll_difference": max(abs(_nll(r, m) - nll) for r, (_, nll) in pairs),
                    "exact_vs_score_disagreements": sum(r["models"][m]["exact"] != bool(score)
                                                        for r, (score, _) in pairs)}
        out["mass"] = {}
        for m in models:
            layers = sorted(int(k) for k in bench[0]["models"][m]["mass"])
            mass = np.array([[r["models"][m]["mass"][str(layer)] for layer in layers] for r in bench])  # [q, l, H]
            out["mass"][m] = {"layers": layers, "best_head": mass.mean(0).max(1).tolist(),
                              "layer_mean": mass.mean((0, 2)).tolist(), "head_mean": mass.mean(0).tolist()}
        if all("swap" in r for r in bench):
            out["swap"] = {}
            for name in bench[0]["swap"]:
                mass = np.array([[r["swap"][name][str(layer)] for layer in kept] for r in bench])
                out["swap"][name] = {"layers": kept, "best_head": mass.mean(0).max(1).tolist(),
                                     "layer_mean": mass.mean((0, 2)).tolist()}
        out["cosine"] = {m: {field: np.mean([r["models"][m][field] for r in bench], 0).tolist()
                             for field in ("cos_value", "cos_last", "cos_all")} for m in models if m != "teacher"}
    if moved:
        out["distance"] = {}
        for form in FORMATS:
            for target in sorted({r["target"] for r in moved if r["format"] == form}):
                group = [r for r in moved if r["format"] == form and r["target"] == target]
                out["distance"][f"{form}/{target}"] = {
                    "format": form, "target": target,
                    "distance": {"mean": float(np.mean([r["distance"] for r in group])),
                                 "min": min(r["distance"] for r in group), "max": max(r["distance"] for r in group)},
                    **_set_summary(group, models, kept)}
        chatml = [r for r in moved if r["format"] == "chatml"]
        pairs = _paired(chatml, [r for r in moved if r["format"] == "plain"], lambda r: (r["item"], r["target"]))
        if pairs:
            out["format"] = {m: {"n": len(pairs),
                                 "chatml_nll": _mean_interval([_nll(c, m) for c, _ in pairs]),
                                 "plain_nll": _mean_interval([_nll(p, m) for _, p in pairs]),
                                 "plain_minus_chatml_nll": _mean_interval([_nll(p, m) - _nll(c, m) for c, p in pairs]),
                                 "chatml_accuracy": _accuracy([c["models"][m]["exact"] for c, _ in pairs]),
                                 "plain_accuracy": _accuracy([p["models"][m]["exact"] for _, p in pairs])}
                             for m in models}
        targets = sorted({r["target"] for r in chatml})
        pairs = _paired([r for r in chatml if r["target"] == targets[0]],
                        [r for r in chatml if r["target"] == targets[-1]], lambda r: r["item"])
        if len(targets) > 1 and pairs:
            out["far_minus_near_nll"] = {"near": targets[0], "far": targets[-1],
                                         **{m: _mean_interval([_nll(f, m) - _nll(n, m) for n, f in pairs])
                                            for m in models}}
    return out


COLOURS = {"teacher": "tab:blue", "hybrid": "tab:red", "split": "tab:green"}
LABELS = {"teacher": "teacher", "hybrid": "hybrid", "split": "teacher, 8 layers full (split proxy)"}


def plot(summary: dict, path: Path) -> None:
    """One figure: answer NLL against the needle's distance in both formats; the needle mass of each kept attention
    layer's best head (and with the streams swapped); the residual stream's cosine to the teacher's, by layer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(17, 4.8))
    cells = summary.get("distance", {}).values()
    for m in (m for m in COLOURS if any(m in cell for cell in cells)):
        for form, style in (("chatml", "-o"), ("plain", "--s")):
            points = sorted((cell["target"], cell[m]["answer_nll"]) for cell in cells if cell["format"] == form)
            if points:
                values = [v for _, v in points]
                left.errorbar([t for t, _ in points], [v["mean"] for v in values], capsize=3, fmt=style,
                              yerr=[[v["mean"] - v["low"] for v in values], [v["high"] - v["mean"] for v in values]],
                              color=COLOURS[m], alpha=0.85, label=f"{LABELS[m]}, {form}")
    left.set_xscale("log")
    left.set(xlabel="needle distance (tokens before the question's last token)",
             ylabel="answer NLL, nats (summed over its tokens)", title="answer NLL vs distance (moved set)")
    left.legend(fontsize=7)
    if "mass" in summary:
        kept = summary["kept_layers"]
        x, width = np.arange(len(kept)), 0.22
        offsets = {"teacher": -width, "hybrid": 0.0, "split": width}
        for m in (m for m in COLOURS if m in summary["mass"]):
            best = dict(zip(summary["mass"][m]["layers"], summary["mass"][m]["best_head"]))
            middle.bar(x + offsets[m], [best[layer] for layer in kept], width, color=COLOURS[m], label=LABELS[m])
        for name, marker, at in (("teacher stream, hybrid layer", "v", "hybrid"),
                                 ("hybrid stream, teacher layer", "^", "teacher")):
            if name in summary.get("swap", {}):
                middle.plot(x + offsets[at], summary["swap"][name]["best_head"], marker, color="black",
                            linestyle="none", label=f"swapped: {name}")
        middle.set_xticks(x, [str(layer) for layer in kept])
        middle.set(xlabel="attention layer", ylabel="needle mass of the best head (mean over questions)",
                   title="last question token -> needle value (bench set)")
        middle.legend(fontsize=7)
    for m, style in (("hybrid", "-"), ("split", "--")):
        for field, colour in (("cos_value", "tab:purple"), ("cos_last", "tab:orange"), ("cos_all", "tab:gray")):
            if m in summary.get("cosine", {}):
                right.plot(summary["cosine"][m][field], style, color=colour, label=f"{m}: {field[4:]}")
    for layer in summary.get("kept_layers", ()):
        right.axvline(layer, color="tab:red", alpha=0.15)
    right.set(xlabel="layer (the residual stream after it; red: attention in the hybrid)",
              ylabel="cosine to the teacher's", title="residual stream vs the teacher's (bench set)")
    right.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def report(args) -> None:
    if not args.rows.exists():
        raise UsageError(f"{args.rows}: no such rows file; write it with `run --out {args.rows}`")
    summary = summarise(_rows(args.rows), {"teacher": args.teacher_rows, "hybrid": args.hybrid_rows})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(summary, args.out / "diagnosis.png")
    print(json.dumps(summary, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    measure = commands.add_parser("run", help="measure every question, appending rows to --out (resumes there)")
    measure.add_argument("--out", type=Path, required=True, help="the rows file (JSONL)")
    measure.add_argument("--bench", type=int, default=10, help="items per task of the bench set")
    measure.add_argument("--moved", type=int, default=10, help="niah_single_2 items whose needle is moved")
    measure.add_argument("--distances", default="100,250,500,1000,1500,2000", help="ChatML needle distances")
    measure.add_argument("--plain-distances", default="100,250,500,1000,1500,2000", help="plain-text needle distances")
    measure.add_argument("--length", type=int, default=2048)
    measure.add_argument("--haystack", default="manpages")
    measure.add_argument("--window", type=int, default=128, help="the split proxy's local window")
    measure.add_argument("--sink", type=int, default=4, help="the split proxy's sink tokens")
    measure.add_argument("--swap", action=argparse.BooleanOptionalAction, default=True,
                         help="swap the kept attention layers between the two residual streams (bench set)")
    measure.add_argument("--limit", type=int, default=None, help="measure at most this many new questions")
    summary = commands.add_parser("report", help="summary.json and diagnosis.png from the rows")
    summary.add_argument("--rows", type=Path, required=True)
    summary.add_argument("--out", type=Path, required=True, help="the folder for summary.json and diagnosis.png")
    summary.add_argument("--teacher-rows", type=Path, default=Path("docs/realmodel/teacher-niah-2048/results.jsonl.gz"),
                         help="the teacher's bench compare rows on the same items, to check against")
    summary.add_argument("--hybrid-rows", type=Path, default=Path("docs/realmodel/hybrid-step1139/results.jsonl.gz"))
    args = parser.parse_args()
    run(args) if args.command == "run" else report(args)


if __name__ == "__main__":
    main()

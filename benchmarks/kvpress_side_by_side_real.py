"""kvpress's pipeline against this project's protocol on a real model: the same press × ratio sweep, real text,
real questions; wall time, peak memory, answers.

The model is SmolLM2-135M-Instruct (``bench fetch-model smollm2-135m-instruct``); the contexts are RULER items
(niah_single_2, niah_multikey_1) on the manual-page haystack, each framed as kvpress's pipeline frames it
(:func:`presses.pipeline.frame`: the chat template's user turn, nothing protected, as kvpress compresses the whole
context).

- **kvpress** (0.5.5): ``kv-press-text-generation`` called once per (context, press, ratio) with every question of
  the context: one compressed prefill (its forward hooks) per call, then each question greedily.
- **this project**: per context one :func:`runtime.prefill` with every press's evidence, one
  :class:`presses.Selection` per press (scored once), one fork per ratio (``flat``, kvpress's per-head rule), and
  every question answered by all the forks at once (:class:`runtime.batch.PaddedBatch`: one decode step for all).

Budgets are equal entry for entry: kvpress keeps ``compute_n_kept(n, r)`` entries per head of an ``n``-token
context, and this side's fork keeps the fraction ``k / n`` of that ``k`` (the flat allocator rounds it back to
``k``). Answers are compared as text (kvpress decodes without special tokens, so does this side). Each side runs in
its own process (one torch thread), its peak resident set its own (``VmHWM``, reset once the model is loaded).

    OMP_NUM_THREADS=1 python benchmarks/kvpress_side_by_side_real.py      # writes docs/kvpress_side_by_side_real.md
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m-instruct"
PRESSES = {"knorm": "KnormPress", "snapkv": "SnapKVPress", "keydiff": "KeyDiffPress"}
"""This project's bridge name of each kvpress press (``kvpress:<name>``) and kvpress's class."""
TASKS = ("niah_single_2", "niah_multikey_1")


def contexts(tokenizer, length: int, n: int):
    """``(context text, question texts, answers)`` of ``n`` RULER items per task on the manual-page haystack."""
    from workloads.tasks.ruler import Config, generate

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    config = Config(length=length, count_tokens=count, haystack="manpages")
    items = [generate(task, i, 0, config) for task in TASKS for i in range(n)]
    return [(item.header + "\n\n" + item.body, [q.text for q in item.questions], [q.answers for q in item.questions])
            for item in items]


def run_kvpress(model, tokenizer, work, names, ratios, max_new_tokens: int) -> dict:
    import kvpress
    from transformers import pipeline

    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device="cpu")
    answers = {}
    for c, (context, questions, _) in enumerate(work):
        for name in names:
            for r in ratios:
                press = getattr(kvpress, PRESSES[name])(compression_ratio=r)
                got = pipe(context, questions=questions, press=press, max_new_tokens=max_new_tokens)["answers"]
                answers[f"{c}/{name}/{r}"] = got
        _progress(f"kvpress: context {c + 1} of {len(work)} done")
    return {"answers": answers}


def run_ours(model, tokenizer, work, names, ratios, max_new_tokens: int) -> dict:
    from kvpress.utils import compute_n_kept

    import presses
    from presses.pipeline import encode_context, frame
    from presses.preparation import evidence_for
    from runtime import adapter_for, encode_text, prefill
    from runtime.batch import PaddedBatch

    adapter = adapter_for(model)
    scorers = {name: presses.get(f"kvpress:{name}") for name in names}
    evidence = evidence_for(scorers.values(), adapter)
    eos = model.generation_config.eos_token_id
    answers, parts = {}, {"prefill": 0.0, "scores": 0.0, "forks": 0.0, "answers": 0.0}
    for c, (context, questions, _) in enumerate(work):
        header, body, suffix = frame(tokenizer, context)
        ids, _ = encode_context(tokenizer, header, body)
        n = len(ids)
        t0 = time.perf_counter()
        parent = prefill(model, torch.tensor(ids), protected=0, evidence=evidence, tokenizer=tokenizer)
        t1 = time.perf_counter()
        selections = {name: presses.Selection(parent, scorer) for name, scorer in scorers.items()}
        for selection in selections.values():
            selection.scores  # noqa: B018 - scored once here, so that the forks' time is the forks' alone
        t2 = time.perf_counter()
        cells = [(name, r) for name in names for r in ratios]
        children = [selections[name].fork("flat", compute_n_kept(n, r) / n) for name, r in cells]
        t3 = time.perf_counter()
        batch = PaddedBatch(children)
        for question in questions:
            question_ids = torch.tensor(encode_text(tokenizer, question + suffix))
            got, _ = batch.answer_and_follow(question_ids, None, max_new_tokens, eos)
            for (name, r), answer in zip(cells, got):
                answers.setdefault(f"{c}/{name}/{r}", []).append(tokenizer.decode(answer.tokens,
                                                                                  skip_special_tokens=True))
        t4 = time.perf_counter()
        for child in children:
            child.release()
        parent.release()
        for part, seconds in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            parts[part] += seconds
        _progress(f"ours: context {c + 1} of {len(work)} done ({n} tokens)")
    return {"answers": answers, "parts": {k: round(v, 2) for k, v in parts.items()}}


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _status_kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1))


def measure_side(args) -> dict:
    from pretrained.loading import load

    torch.set_num_threads(args.threads)
    model, tokenizer, _ = load(MODEL)
    work = contexts(tokenizer, args.length, args.n)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS: the peak is this side's work
    before = _status_kib("VmRSS")
    t0, c0 = time.perf_counter(), time.process_time()
    run = run_kvpress if args.side == "kvpress" else run_ours
    result = run(model, tokenizer, work, args.presses, args.ratios, args.max_new_tokens)
    result.update(seconds=round(time.perf_counter() - t0, 2), cpu_seconds=round(time.process_time() - c0, 2),
                  rss_before_mib=before // 1024, peak_rss_mib=_status_kib("VmHWM") // 1024)
    return result


def write_report(args, command: str, sides: dict, work) -> str:
    from workloads.metrics import METRICS

    theirs, ours = sides["kvpress"], sides["ours"]
    lines = ["| press | compression ratio | answers equal | kvpress correct | this project correct |",
             "|---|---|---|---|---|"]
    equal_all = total_all = 0
    for name in args.presses:
        for r in args.ratios:
            equal = right_theirs = right_ours = total = 0
            for c, (_, _, answers) in enumerate(work):
                key = f"{c}/{name}/{r}"
                for a, b, truth in zip(theirs["answers"][key], ours["answers"][key], answers):
                    total += 1
                    equal += a == b
                    right_theirs += METRICS["string_match_all"](a, truth) == 1.0
                    right_ours += METRICS["string_match_all"](b, truth) == 1.0
            equal_all, total_all = equal_all + equal, total_all + total
            lines.append(f"| {PRESSES[name]} | {r} | {equal} / {total} | {right_theirs} / {total} | "
                         f"{right_ours} / {total} |")
    questions = sum(len(q) for _, q, _ in work)
    parts = ", ".join(f"{k} {v} s" for k, v in ours["parts"].items())
    return "\n".join([
        "# kvpress side by side on a real model", "",
        f"SmolLM2-135M-Instruct (`--model {MODEL}`, float32, CPU, {args.threads} thread per side, one side at a time "
        f"on an otherwise idle machine), kvpress {version('kvpress')}, transformers {version('transformers')}, torch "
        f"{torch.__version__}. {len(work)} RULER contexts of {args.length} tokens on the manual-page haystack "
        f"({', '.join(TASKS)}; {questions} questions), {len(args.presses)} presses × {len(args.ratios)} compression "
        f"ratios, greedy, {args.max_new_tokens} new tokens at most. Command: `{command}`.", "",
        "| side | wall s | CPU s | peak resident set (MiB, model loaded before) |", "|---|---|---|---|",
        f"| kvpress pipeline (one compressed prefill per context × press × ratio) | {theirs['seconds']} | "
        f"{theirs['cpu_seconds']} | {theirs['peak_rss_mib']} ({theirs['rss_before_mib']}) |",
        f"| this project (one prefill per context, forks answered as one batch) | {ours['seconds']} | "
        f"{ours['cpu_seconds']} | {ours['peak_rss_mib']} ({ours['rss_before_mib']}) |", "",
        f"**kvpress's wall time / this project's: {theirs['seconds'] / ours['seconds']:.2f}×**; answers equal "
        f"{equal_all} of {total_all}. This project's time by part: {parts}. Its peak is the higher: it holds every "
        f"child of a context at once ({len(args.presses) * len(args.ratios)} here) and their padded batch, where "
        "kvpress holds one compressed cache at a time.", "",
        "## Answers", "", *lines, "",
        "Budgets are equal entry for entry (kvpress's `compute_n_kept`); an answer that differs comes from a "
        "different kept set (exact score ties at the budget's edge: kvpress keeps what `torch.topk` returns among "
        "them, this project the earliest positions; `docs/kvpress_parity_real.md` shows where they occur) or from "
        "floating-point reassociation in the batched decode, which can flip a near-tie between two tokens.", "",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--n", type=int, default=2, help="items per task")
    parser.add_argument("--presses", nargs="+", default=list(PRESSES), choices=list(PRESSES))
    parser.add_argument("--ratios", nargs="+", type=float, default=[0.5, 0.75, 0.875])
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "kvpress_side_by_side_real.md")
    parser.add_argument("--side", choices=("kvpress", "ours"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        print(json.dumps(measure_side(args)))
        return 0
    passed = list(argv if argv is not None else sys.argv[1:])
    sides = {}
    for side in ("ours", "kvpress"):
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        done = subprocess.run([sys.executable, __file__, *passed, "--side", side], env=env, check=True,
                              stdout=subprocess.PIPE, text=True)
        sides[side] = json.loads(done.stdout.strip().splitlines()[-1])
        _progress(f"{side}: {sides[side]['seconds']} s wall")
    from pretrained.loading import load

    _, tokenizer, _ = load(MODEL)
    command = " ".join(["OMP_NUM_THREADS=1 python benchmarks/kvpress_side_by_side_real.py", *passed])
    args.out.write_text(write_report(args, command, sides, contexts(tokenizer, args.length, args.n)))
    _progress(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

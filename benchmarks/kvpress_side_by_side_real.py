"""kvpress's pipeline against this project's protocol on a real model: the same press × ratio sweep, real text,
real questions; wall time, peak memory, answers.

The model is SmolLM2-135M-Instruct (``bench fetch-model smollm2-135m-instruct``); the contexts are RULER items
(niah_single_2, niah_multikey_1) on the manual-page haystack, each framed as kvpress's pipeline frames it
(:func:`presses.pipeline.frame`: the chat template's user turn, nothing protected, as kvpress compresses the whole
context).

- **kvpress** (0.5.5): ``kv-press-text-generation`` called once per (context, press, ratio) with every question of
  the context: one compressed prefill (its forward hooks) per call, then each question greedily.
- **this project**: per context one :func:`runtime.prefill` with every press's evidence, one
  :class:`presses.Selection` per press (scored once, after which the prefill's evidence is dropped), one fork per
  ratio (``flat``, kvpress's per-head rule), and every question answered by the forks together in groups
  (:class:`runtime.batch.PaddedBatch`: one decode step for a group), each group as large as ``--memory-budget``
  allows (:func:`runtime.batch_memory.groups_within`); its children are forked when the previous group is answered.

Budgets are equal entry for entry: kvpress keeps ``compute_n_kept(n, r)`` entries per head of an ``n``-token
context, and this side's fork keeps the fraction ``k / n`` of that ``k`` (the flat allocator rounds it back to
``k``). Answers are compared as text (kvpress decodes without special tokens, so does this side). Each side runs in
its own process (one torch thread), its peak resident set its own (``VmHWM``, reset once the model is loaded).

    OMP_NUM_THREADS=1 python benchmarks/kvpress_side_by_side_real.py      # writes docs/kvpress_side_by_side_real.md
    OMP_NUM_THREADS=1 python benchmarks/kvpress_side_by_side_real.py --n 1 --out /tmp/side.md   # a smaller sweep
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


def run_ours(model, tokenizer, work, names, ratios, max_new_tokens: int, budget: int) -> dict:
    from kvpress.utils import compute_n_kept

    import presses
    from presses.pipeline import encode_context, frame
    from presses.preparation import evidence_for
    from runtime import Evidence, adapter_for, encode_text, prefill
    from runtime.batch import PaddedBatch
    from runtime.batch_memory import groups_within

    adapter = adapter_for(model)
    scorers = {name: presses.get(f"kvpress:{name}") for name in names}
    evidence = evidence_for(scorers.values(), adapter)
    eos = model.generation_config.eos_token_id
    answers, parts = {}, {"prefill": 0.0, "scores": 0.0, "forks": 0.0, "answers": 0.0}
    groups = passes = 0
    # similar budgets side by side (kept fractions ascending): a group is padded to its largest child
    cells = sorted(((name, r) for name in names for r in ratios), key=lambda cell: -cell[1])
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
        parent.evidence = Evidence()  # every attention layer's hidden states, which kvpress's presses read, are done
        parts["prefill"] += t1 - t0
        parts["scores"] += time.perf_counter() - t1
        question_ids = [torch.tensor(encode_text(tokenizer, question + suffix)) for question in questions]

        def plans():
            for name, r in cells:
                t = time.perf_counter()
                plan = selections[name].plan("flat", compute_n_kept(n, r) / n)
                parts["forks"] += time.perf_counter() - t
                yield (name, r), plan

        tokens = max(q.numel() for q in question_ids) + max_new_tokens
        for group in groups_within(parent, plans(), tokens, budget=budget):
            t2 = time.perf_counter()
            batch = PaddedBatch.forks(parent, [plan for _, plan in group])  # each child released once in place
            t3 = time.perf_counter()
            for question in question_ids:
                got, _ = batch.answer_and_follow(question, None, max_new_tokens, eos)
                passes += max(len(answer.tokens) for answer in got)  # the question's pass, then one per token more
                for ((name, r), _), answer in zip(group, got):
                    answers.setdefault(f"{c}/{name}/{r}", []).append(tokenizer.decode(answer.tokens,
                                                                                      skip_special_tokens=True))
            del batch
            groups += 1
            parts["forks"] += t3 - t2
            parts["answers"] += time.perf_counter() - t3
        parent.release()
        _progress(f"ours: context {c + 1} of {len(work)} done ({n} tokens)")
    return {"answers": answers, "parts": {k: round(v, 2) for k, v in parts.items()}, "groups": groups,
            "passes": passes}


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
    if args.side == "kvpress":
        result = run_kvpress(model, tokenizer, work, args.presses, args.compression_ratios, args.max_new_tokens)
    else:
        result = run_ours(model, tokenizer, work, args.presses, args.compression_ratios, args.max_new_tokens,
                          args.memory_budget * 2**20)
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
        for r in args.compression_ratios:
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
        f"({', '.join(TASKS)}; {questions} questions), {len(args.presses)} presses × "
        f"{len(args.compression_ratios)} compression ratios, greedy, {args.max_new_tokens} new tokens at most. "
        f"Command: `{command}`.", "",
        "| side | wall s | CPU s | peak resident set (MiB, model loaded before) |", "|---|---|---|---|",
        f"| kvpress pipeline (one compressed prefill per context × press × ratio) | {theirs['seconds']} | "
        f"{theirs['cpu_seconds']} | {theirs['peak_rss_mib']} ({theirs['rss_before_mib']}) |",
        f"| this project (one prefill per context, forks answered in padded batches) | {ours['seconds']} | "
        f"{ours['cpu_seconds']} | {ours['peak_rss_mib']} ({ours['rss_before_mib']}) |", "",
        f"**kvpress's wall time / this project's: {theirs['seconds'] / ours['seconds']:.2f}×; this project's peak / "
        f"kvpress's: {ours['peak_rss_mib'] / theirs['peak_rss_mib']:.2f}×**; answers equal {equal_all} of "
        f"{total_all}. This project's time by part: {parts}. It answers the "
        f"{len(args.presses) * len(args.compression_ratios)} children of a context in groups that hold at most "
        f"{args.memory_budget} MiB each (`--memory-budget`; "
        f"{ours['groups']} padded batches over {len(work)} contexts, {ours['passes']} batched forward passes), each "
        "child forked into its place in the batch and released at once, each batch released once answered; kvpress "
        "holds one compressed cache at a time.", "",
        "## Answers", "", *lines, "",
        "Budgets are equal entry for entry (kvpress's `compute_n_kept`); an answer that differs comes from a "
        "different kept set (exact score ties at the budget's edge: kvpress keeps what `torch.topk` returns among "
        "them, this project the earliest positions; `docs/kvpress_parity_real.md` shows where they occur) or from "
        "floating-point reassociation in the batched decode, which can flip a near-tie between two tokens.", "",
    ])


def main(argv: list[str] | None = None) -> int:
    from runtime.batch_memory import DEFAULT_MEMORY_BUDGET

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--n", type=int, default=2, help="items per task")
    parser.add_argument("--presses", nargs="+", default=list(PRESSES), choices=list(PRESSES))
    parser.add_argument("--compression-ratios", nargs="+", type=float, default=[0.5, 0.75, 0.875])
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--memory-budget", type=int, default=DEFAULT_MEMORY_BUDGET >> 20,
                        help="MiB one group of a context's children may hold (runtime.batch_memory.groups_within)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "kvpress_side_by_side_real.md")
    parser.add_argument("--side", choices=("kvpress", "ours"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_budget < 1:
        parser.error(f"--memory-budget must be at least 1 MiB, got {args.memory_budget}")
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

"""kvpress's own mechanics against this project's protocol on one dense model: time, peak memory, parity.

The work both tools can do: a random dense Qwen3 (built from a config, nothing downloaded), one context, kvpress's
SnapKV, Knorm and KeyDiff presses at whole-size kept fractions (p·n an integer), every question answered greedily.

- **kvpress** (0.5.5): its pipeline ``kv-press-text-generation``, called once per (press, ratio) with every
  question: one compressed prefill (its forward hooks) per call, then the questions from that cache.
- **this project**: one :func:`runtime.prefill` with the presses' evidence, one :class:`presses.Selection` per
  press (scored once), one fork per kept fraction (the ``flat`` allocator, kvpress's per-head rule), every
  question from the fork.

Each side runs in its own process (the same seeded model and workload), timed by the wall clock and by the
process's CPU clock (with one thread, the figure the other sessions' load on a shared machine disturbs least), with
a peak resident set of its own: the peak (``VmHWM`` of ``/proc/self/status``, reset through
``/proc/self/clear_refs`` once the model is built) and the resident set before the work starts are reported.
tracemalloc is not used: it sees only Python's allocator, not torch's tensor memory.

The parity check (untimed, in this process) runs kvpress's forward hooks as its pipeline does
(``model.model(context)`` inside ``with press(model)``), recovers the positions every compressed head kept by
matching its key rows against the uncompressed cache's (they are bit-identical: the hook compresses a layer's
cache after that layer's attention, so no later layer sees a difference), and compares them with the positions of
this project's plan; then the first answer token's logits of every question. Where kept sets differ it checks
whether every difference is an exact tie at the budget's boundary, and forks this runtime on kvpress's own
positions, which separates a tie-breaking difference from a difference in the cache itself.

The two sides and what they measure: ``kvpress_side_by_side_runs.py``; the page: ``kvpress_side_by_side_report.py``.

    OMP_NUM_THREADS=1 python benchmarks/kvpress_side_by_side.py            # writes docs/kvpress_side_by_side.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import torch
from kvpress.utils import compute_n_kept
from kvpress_side_by_side_report import write_report
from kvpress_side_by_side_runs import (
    COMPONENT_PRESS,
    build_model,
    components,
    equal_norm_fraction,
    measure_side,
    progress,
    shown,
    workload,
)

import presses
from allocators import BudgetRequest
from hybridmodel.tokenizer import build_tokenizer
from runtime import prefill
from testing.kvpress_parity import parity

ROOT = Path(__file__).resolve().parent.parent
PRESSES = ("snapkv", "knorm", "keydiff")
KEEP_FRACTIONS = (0.125, 0.25, 0.5)


def run_side_process(side: str, argv: list[str]) -> dict:
    """One side in a fresh process (its peak resident set its own); its JSON line."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run([sys.executable, __file__, *argv, "--side", side], env=env, check=True,
                          stdout=subprocess.PIPE, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", type=int, default=2048, help="context tokens, framing included")
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--question-chars", type=int, default=16, help="bytes (tokens) of each question's text")
    parser.add_argument("--answer-tokens", type=int, default=16, help="greedy tokens per answer")
    parser.add_argument("--presses", nargs="+", default=list(PRESSES), help="kvpress short names (kvpress:<name>)")
    parser.add_argument("--keep", nargs="+", type=float, default=list(KEEP_FRACTIONS), help="kept fractions p")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the machine is shared)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "kvpress_side_by_side.md")
    parser.add_argument("--side", choices=("kvpress", "ours"), help=argparse.SUPPRESS)  # one side, JSON to stdout
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.side:
        print(json.dumps(measure_side(args)))
        return 0
    for p in args.keep:
        if compute_n_kept(args.context, 1 - p) != BudgetRequest(keep_fraction=p, n_body=args.context, layers=[0],
                                                                 num_kv_heads=1).per_head:
            parser.error(f"p = {p}: kvpress and the flat allocator keep different counts at n = {args.context} "
                         "(not a whole-size budget); the side-by-side compares equal budgets")
    load_start = f"{os.getloadavg()[0]:.2f}"
    sides = {}
    for side in ("kvpress", "ours"):
        progress(f"== {side} (own process)")
        sides[side] = run_side_process(side, argv)
        side_result = sides[side]
        progress(f"== {side}: {shown(side_result['total'])}, peak RSS {side_result['peak_rss_kib'] / 1024:.0f} MiB")
    progress("== parity")
    torch.set_num_threads(args.threads)
    model = build_model(args.layers, args.hidden, args.heads, args.kv_heads, args.head_dim, args.seed)
    tokenizer = build_tokenizer()
    work = workload(tokenizer, args.context, args.questions, args.question_chars, args.seed)
    ids, questions_ids = work[0], work[3]
    parent = prefill(model, ids, protected=0, evidence=presses.get(f"kvpress:{args.presses[0]}").evidence(None))
    checks = []
    for name in args.presses:
        for p in args.keep:
            checks.append(parity(model, ids, questions_ids, name, p, parent=parent))
            progress(f"parity   {name:8s} p={p:<6} {asdict(checks[-1])}")
    window = window_size = None
    if "snapkv" in args.presses:  # a budget of half SnapKV's window, outside the sweep: where its window ties
        window_size = presses.get("kvpress:snapkv").press.window_size
        window = parity(model, ids, questions_ids, "snapkv", (window_size // 2) / args.context, parent=parent)
        progress(f"parity   snapkv below its window {asdict(window)}")
    progress("== where the time goes")
    parts = components(model, tokenizer, work, *COMPONENT_PRESS, answer_tokens=args.answer_tokens)
    for part, seconds in parts.items():
        progress(f"{part}: {seconds:.3f} s")
    load_end = f"{os.getloadavg()[0]:.2f}"
    write_report(args.out, args, argv, sides, checks, equal_norm_fraction(model, ids), (load_start, load_end),
                 parts, window, window_size)
    progress(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One context of ``bench compare``'s protocol on the real model, timed by part, for two source trees in one run.

Each measurement is a fresh process running :class:`bench.run.context_run.ContextRun` on context 0 of a task (rows kept
in memory), with the source tree named on the command line first on ``sys.path`` — so the same workload is timed
on, say, the commit before an optimisation and the working tree, alternating ``--rounds`` times, and the ratio of
the two is read from one run. Parts: the prefill and each press's scoring as the rows record them, and the rest of
the context (forks, answering every child, the full-cache reference, needle ranks, rows). Between two trees it
says whether the rows agree: the same answers and scores (:data:`ROW_KEYS`), bit for bit, and the largest
difference of their measured values (:data:`ROW_VALUES`).

    git worktree add /tmp/before <commit>
    OMP_NUM_THREADS=1 python benchmarks/context_speed.py --tree before=/tmp/before --tree after=. --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

METHODS = "snapkv/flat,keydiff/flat,kvzip/flat,kvzip/global,kvpress:KnormPress/flat"
ROW_KEYS = ("press", "allocator", "keep_fraction", "question", "prediction", "score")
"""What identifies a row and what it answered: equal between trees for the same work."""
ROW_VALUES = ("answer_nll", "delta_nll", "kl", "kv_bytes")
"""The row's measured values: compared between trees by their largest difference (a batch of another size rounds
a reduction differently)."""


def measure(args) -> dict:
    """Run the context in this process (the tree is already first on ``sys.path``) and return its figures."""
    import torch

    from bench.run.context_run import ContextRun
    from bench.run.harness import Harness
    from bench.run.settings import CompareSettings

    torch.set_num_threads(1)
    settings = CompareSettings(presses=[], pairs=args.methods.split(","), keep_fractions=args.keep_fractions,
                               tasks=[args.task], n=1, length=args.length, model=args.model, haystack=args.haystack)
    try:  # a tree with bench.run.plan: the run planned once, the model fingerprinted once
        from bench.run.plan import plan

        run = plan(settings)
        harness = Harness(run, run.model.identity)
    except ImportError:  # older trees: a CheckedSettings, or (before it) checked in place, returning None
        from bench.run.settings import validate

        harness = Harness(validate(settings) or settings)
    rows: list[dict] = []
    t0 = time.perf_counter()
    ContextRun(harness, args.task, 0, lambda key: False, rows.append).run()
    total = time.perf_counter() - t0
    scoring = {}
    for row in rows:
        if row.get("score_seconds") is not None:
            scoring[row["press"]] = row["score_seconds"]
    prefill = rows[0]["prefill_seconds"]
    return {"context_s": round(total, 2), "prefill_s": prefill, "scoring_s": scoring,
            "rest_s": round(total - prefill - sum(scoring.values()), 2), "rows": len(rows),
            "rows_seen": [{key: row.get(key) for key in ROW_KEYS + ROW_VALUES} for row in rows],
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[], help="label=path of a source tree (repeatable)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--task", default="niah_single_2")
    parser.add_argument("--haystack", default="manpages")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--methods", default=METHODS)
    parser.add_argument("--keep-fractions", type=lambda t: [float(x) for x in t.split(",")], default=[0.1, 0.3, 0.5])
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help="append the JSON results to this file")
    args = parser.parse_args(argv)
    if args.inner:
        print(json.dumps(measure(args)))
        return 0
    trees = dict(entry.split("=", 1) for entry in args.tree) or {"here": "."}
    passed = ["--length", str(args.length), "--task", args.task, "--haystack", args.haystack, "--model", args.model,
              "--methods", args.methods, "--keep-fractions", ",".join(map(str, args.keep_fractions))]
    results: dict[str, list[dict]] = {label: [] for label in trees}
    for round_ in range(args.rounds):
        for label, path in trees.items():
            env = {**os.environ, "PYTHONPATH": str(Path(path).resolve()), "OMP_NUM_THREADS": "1"}
            done = subprocess.run([sys.executable, __file__, "--inner", *passed], env=env, check=True,
                                  capture_output=True, text=True)
            figures = json.loads(done.stdout.strip().splitlines()[-1])
            results[label].append(figures)
            print(f"round {round_ + 1} {label}: context {figures['context_s']} s, prefill {figures['prefill_s']} s, "
                  f"scoring {figures['scoring_s']}, rest {figures['rest_s']} s", file=sys.stderr, flush=True)
    summary = {label: {"context_s": statistics.median(r["context_s"] for r in runs),
                       "prefill_s": statistics.median(r["prefill_s"] for r in runs),
                       "rest_s": statistics.median(r["rest_s"] for r in runs),
                       "scoring_s": {press: statistics.median(r["scoring_s"][press] for r in runs)
                                     for press in runs[0]["scoring_s"]},
                       "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
                       "same_rows_every_round": all(r["rows_seen"] == runs[0]["rows_seen"] for r in runs)}
               for label, runs in results.items()}
    labels = list(trees)
    if len(labels) == 2:
        first, second = (summary[label] for label in labels)
        a, b = (results[label][0]["rows_seen"] for label in labels)
        summary["rows_same_answers"] = len(a) == len(b) and all(
            [x[k] for k in ROW_KEYS] == [y[k] for k in ROW_KEYS] for x, y in zip(a, b))
        summary["rows_bit_equal"] = a == b
        summary["rows_max_value_difference"] = max(
            (abs(x[k] - y[k]) for x, y in zip(a, b) for k in ROW_VALUES if x[k] is not None and y[k] is not None),
            default=0.0)
        summary["ratio_context"] = round(first["context_s"] / second["context_s"], 2)
        summary["ratio_rest"] = round(first["rest_s"] / second["rest_s"], 2)
    text = json.dumps({"args": {k: v for k, v in vars(args).items() if k not in ("inner", "out")}, **summary})
    print(text)
    if args.out:
        with args.out.open("a") as handle:
            handle.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

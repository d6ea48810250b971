"""Paired differences between methods of two result stores on the same items (e.g. an estimator before and after
retraining): each store's methods are renamed ``<method> [<label>]``, rows of both are resampled together by item
(paired bootstrap, 1,000 resamples), and the chosen differences are printed as a Markdown table with n.

    python scripts/paired_runs.py before=results/realtext-before after=results/realtext-after \
        --pairs "gatesight/gate [after]-kvzip/flat [after]" "gatesight/gate [after]-gatesight/gate [before]"

Items are paired by (task, haystack, item, question); the two stores must hold the same items (same generator
seeds), which the script checks. Without ``--pairs`` it prints every method's accuracy and ΔNLL.
"""

from __future__ import annotations

import argparse

from bench.stats import PairedBootstrap, method_of
from bench.store import BASELINE, ResultStore


def load(labelled: list[str]) -> list[dict]:
    rows = []
    for index, spec in enumerate(labelled):
        label, _, directory = spec.partition("=")
        for row in ResultStore(directory, readonly=True).rows:
            if method_of(row) != BASELINE:
                rows.append({**row, "allocator": f"{row['allocator']} [{label}]"})
            elif index == 0:  # one shared full cache: every store's no-prune rows are the same model on the same items
                rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stores", nargs="+", help="label=directory")
    parser.add_argument("--ratios", default="0.02,0.05,0.1")
    parser.add_argument("--pairs", nargs="*", default=[], help="'A-B' method names as printed (A − B)")
    parser.add_argument("--tasks", default=None, help="comma list of tasks as reports name them (default: all)")
    args = parser.parse_args()
    rows = load(args.stores)
    ratios = [float(r) for r in args.ratios.split(",")]
    for field, scale, unit in (("score", 100, "accuracy (points)"), ("delta_nll", 1, "ΔNLL (nats)")):
        boot = PairedBootstrap(rows, field)
        tasks = args.tasks.split(",") if args.tasks else boot.tasks
        n = ", ".join(f"{t} n = {boot.n_items(t)}" for t in tasks)
        print(f"\n### {unit}, mean over {len(tasks)} task(s) ({n}), 95 % paired-bootstrap interval\n")
        print("| | " + " | ".join(f"p = {r:g}" for r in ratios) + " |")
        print("|---|" + "---|" * len(ratios))
        methods = sorted({m for m, _ in boot.cells if m != BASELINE})
        base = boot.average(BASELINE, 1.0, tasks)
        print(f"| no prune | {base.format(scale, 1 if scale == 100 else 3)} |" + " |" * (len(ratios) - 1))
        for method in methods:
            cells = [boot.average(method, r, tasks).format(scale, 1 if scale == 100 else 3)
                     if all(boot.has(method, r, t) for t in tasks) else "–" for r in ratios]
            print(f"| {method} | " + " | ".join(cells) + " |")
        for pair in args.pairs:
            a, _, b = pair.partition("]-")
            a += "]"
            cells = [boot.difference(a, r, b, r, tasks).format(scale, 1 if scale == 100 else 3) for r in ratios]
            print(f"| {a} − {b} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

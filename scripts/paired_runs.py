"""Paired differences between methods of two result stores on the same items (e.g. an estimator before and after
retraining): each store's methods are renamed ``<method> [<label>]``, rows of both are resampled together by item
(paired bootstrap, 1,000 resamples), and the chosen differences are printed as a Markdown table with n.

    python scripts/paired_runs.py before=results/realtext-before after=results/realtext-after \
        --pairs "gatesight/gate [after]-kvzip/flat [after]" "gatesight/gate [after]-gatesight/gate [before]"

A store that holds several models (the committed ``docs/results``) is read as ``label=directory#model``: that
model's rows only, or ``label=directory#model@length`` where it holds the model at several lengths. Items are
paired by (task, haystack, item, question); the stores must hold the same items (same generator seeds, same
tokenizer): every store's no-prune rows must give exactly the first store's scores and log-likelihoods on them, and
a store whose rows are not all on those items is refused. Without ``--pairs`` it prints every method's accuracy,
ΔNLL and answer recall.
"""

from __future__ import annotations

import argparse

from bench.reports.stats import PairedBootstrap, method_of
from bench.store.result_store import open_stores
from bench.store.row_fields import BASELINE


def _question(row: dict) -> tuple:
    return row["task"], row.get("haystack", "generated"), row["item"], row.get("question", 0)


def load(labelled: list[str]) -> list[dict]:
    """Rows of every ``label=directory[#model]`` store, methods renamed ``<method> [<label>]``, the first store's
    no-prune rows standing for all. ``SystemExit`` naming the store whose items differ from the first one's."""
    rows, full_cache = [], {}
    for index, spec in enumerate(labelled):
        label, _, location = spec.partition("=")
        directory, _, model = location.partition("#")
        model, _, length = model.partition("@")
        stored = [row for store in open_stores([directory]) for row in store.rows  # a store or a collection
                  if (not model or row["model"] == model) and (not length or row["length"] == int(length))]
        if not stored:
            raise SystemExit(f"{spec}: no rows" + (f" of model {model!r}" if model else ""))
        baseline = {_question(row): (row["score"], row.get("answer_nll"))
                    for row in stored if method_of(row) == BASELINE}
        if index == 0:
            full_cache = baseline
        elif baseline != {q: full_cache.get(q) for q in baseline}:
            raise SystemExit(f"{spec}: its no-prune rows differ from {labelled[0]}'s: not the same items or model")
        off_items = {_question(row) for row in stored} - set(full_cache)
        if off_items:
            raise SystemExit(f"{spec}: {len(off_items)} question(s) not in {labelled[0]}'s no-prune rows, e.g. "
                             f"{sorted(off_items)[0]}")
        for row in stored:
            if method_of(row) != BASELINE:
                rows.append({**row, "allocator": f"{row['allocator']} [{label}]"})
            elif index == 0:  # one shared full cache, checked above to be every store's
                rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stores", nargs="+", help="label=directory")
    parser.add_argument("--keep-fractions", default="0.02,0.05,0.1", help="kept fractions p, comma list")
    parser.add_argument("--pairs", nargs="*", default=[], help="'A-B' method names as printed (A − B)")
    parser.add_argument("--tasks", default=None, help="comma list of tasks as reports name them (default: all)")
    args = parser.parse_args()
    rows = load(args.stores)
    keep_fractions = [float(p) for p in args.keep_fractions.split(",")]
    printed = {method_of(row) for row in rows}
    for pair in args.pairs:
        a, _, b = pair.partition("]-")
        for method in (a + "]", b):
            if method not in printed:
                parser.error(f"--pairs {pair!r}: no method {method!r} in the stores; they hold "
                             + ", ".join(sorted(printed)))
    for field, scale, unit in (("score", 100, "accuracy (points)"), ("delta_nll", 1, "ΔNLL (nats)"),
                               ("answer_recall", 100, "answer recall (% of answer entries kept, all heads)")):
        boot = PairedBootstrap(rows, field)
        tasks = args.tasks.split(",") if args.tasks else boot.tasks
        n = ", ".join(f"{t} n = {boot.n_items(t)}" for t in tasks)
        print(f"\n### {unit}, mean over {len(tasks)} task(s) ({n}), 95 % paired-bootstrap interval\n")
        print("| | " + " | ".join(f"p = {p:g}" for p in keep_fractions) + " |")
        print("|---|" + "---|" * len(keep_fractions))
        methods = sorted({m for m, _ in boot.cells if m != BASELINE})
        if boot.has_baseline():  # rows without the field (answer recall of the full cache) print no line
            base = boot.average(BASELINE, 1.0, tasks)
            print(f"| no prune | {base.format(scale, 1 if scale == 100 else 3)} |" + " |" * (len(keep_fractions) - 1))
        for method in methods:
            cells = [boot.average(method, p, tasks).format(scale, 1 if scale == 100 else 3)
                     if all(boot.has(method, p, t) for t in tasks) else "–" for p in keep_fractions]
            print(f"| {method} | " + " | ".join(cells) + " |")
        for pair in args.pairs:
            a, _, b = pair.partition("]-")
            a += "]"
            cells = [boot.difference(a, p, b, p, tasks).format(scale, 1 if scale == 100 else 3)
                     for p in keep_fractions]
            print(f"| {a} − {b} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

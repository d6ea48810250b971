"""KVzip's scoring time as a ratio to the prefill on the real models, for two source trees in one run.

Each measurement is a fresh process with one source tree first on ``sys.path``, one thread: it loads the model,
warms up on a 64-token context, prefills ``--lengths`` tokens of held-out real text (``protected=4``), times the
prefill and KVzip's scoring (``presses.Selection(...).scores``: its reconstruction passes, 2,000-token chunks) and
writes the scores and the kept positions (flat and global at kept fractions 0.1, 0.3, 0.5). Per (model, length) the
trees alternate, A B A B, ``--repeats`` times; the summary gives, per tree, the medians of the prefill, the scoring
and the per-round ratio scoring / prefill, and between the first two trees the median of the per-round ratios of
their scoring times, whether their scores are equal bit for bit and how many kept entries differ (every round
against the first tree's first round; the largest count).

    git worktree add /tmp/before <the commit before the change>     # or: git archive <commit> | tar -x -C /tmp/before
    OMP_NUM_THREADS=1 python benchmarks/kvzip_cost.py --tree before=/tmp/before --tree after=. --repeats 3

``--env LABEL:NAME=VALUE`` sets a variable in one tree's processes only, so that one tree under two environments
is compared the same way (``--tree glibc=. --tree hugepages=. --env hugepages:GLIBC_TUNABLES=glibc.malloc.hugetlb=1``:
glibc's allocator with and without transparent huge pages for its large blocks).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

MODELS = ("smollm2-135m-instruct", "smollm2-135m-hybrid")
PLANS = [(allocator, p) for allocator in ("flat", "global") for p in (0.1, 0.3, 0.5)]


def measure(model_name: str, length: int, out: Path) -> dict:
    """Time one prefill and KVzip's scoring of it in this process (its tree already first on ``sys.path``); write
    the scores and kept positions to ``out``."""
    import presses
    from pretrained.loading import load
    from runtime import prefill
    from workloads.corpus import documents

    torch.set_num_threads(1)
    model, tokenizer, _ = load(model_name)
    text = "\n\n".join(body for _, body in documents("python-stdlib", "heldout"))
    ids = torch.tensor(tokenizer(text[: 40 * length])["input_ids"][:length])
    if ids.numel() < length:
        raise SystemExit(f"only {ids.numel()} tokens of held-out text; ask for fewer")
    # first-call allocations and lazy initialisation, outside the timings
    presses.Selection(prefill(model, ids[:64], protected=4, tokenizer=tokenizer), "kvzip").scores  # noqa: B018
    t0 = time.perf_counter()
    parent = prefill(model, ids, protected=4, tokenizer=tokenizer)
    prefill_s = time.perf_counter() - t0
    selection = presses.Selection(parent, "kvzip")
    scores = selection.scores
    kept = {f"{allocator}@{p}": selection.plan(allocator, p).layers for allocator, p in PLANS}
    torch.save({"scores": scores, "kept": kept}, out)
    return {"prefill_s": round(prefill_s, 3), "score_s": round(selection.score_seconds, 3)}


def _same(first: dict, other: dict) -> tuple[bool, int, int, float]:
    """Whether two runs' scores are equal bit for bit, how many of the first run's kept entries (every plan, layer
    and head) the other does not keep, out of how many, and their largest score difference."""
    scores, kept = first["scores"], first["kept"]
    scores_equal = all(torch.equal(scores[layer], other["scores"][layer]) for layer in scores)
    differ = total = 0
    for plan in kept:
        for layer in kept[plan]:
            for a, b in zip(kept[plan][layer], other["kept"][plan][layer], strict=True):
                total += a.numel()
                differ += len(set(a.tolist()) - set(b.tolist()))
    diff = max(float((scores[layer] - other["scores"][layer]).abs().max()) for layer in scores)
    return scores_equal, differ, total, diff


def _trees(entries: list[str], parser) -> dict[str, Path]:
    trees = {}
    for entry in entries or ["here=."]:
        label, _, path = entry.partition("=")
        if not label or not path or not (Path(path) / "presses" / "kvzip.py").is_file():
            parser.error(f"--tree {entry!r}: expected label=path of a source tree of this project (with "
                         "presses/kvzip.py)")
        if label in trees:
            parser.error(f"--tree {entry!r}: the label {label!r} is given twice")
        trees[label] = Path(path).resolve()
    return trees


def _environments(entries: list[str], trees: dict[str, Path], parser) -> dict[str, dict[str, str]]:
    """``["label:NAME=VALUE", …]`` -> ``{label: {NAME: VALUE}}``, each label one of ``trees``."""
    environments: dict[str, dict[str, str]] = {label: {} for label in trees}
    for entry in entries:
        label, _, assignment = entry.partition(":")
        name, equals, value = assignment.partition("=")
        if label not in trees or not name or not equals:
            parser.error(f"--env {entry!r}: expected LABEL:NAME=VALUE with LABEL one of the trees "
                         f"({', '.join(trees)})")
        environments[label][name] = value
    return environments


def compare(model_name: str, length: int, trees: dict[str, Path], repeats: int, scratch: Path,
            environments: dict[str, dict[str, str]]) -> dict:
    """``repeats`` rounds of one fresh process per tree, alternating, and their summary (see the module's doc)."""
    labels = list(trees)
    runs: dict[str, list[dict]] = {label: [] for label in labels}
    files: dict[str, list[Path]] = {label: [] for label in labels}
    for round_ in range(repeats):
        for label, path in trees.items():
            out = scratch / f"{model_name}-{length}-{label}-{round_}.pt"
            env = {**os.environ, "PYTHONPATH": str(path), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                   **environments[label]}
            done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--inner", model_name, str(length),
                                   str(out)], env=env, check=True, capture_output=True, text=True)
            figures = json.loads(done.stdout.strip().splitlines()[-1])
            runs[label].append(figures)
            files[label].append(out)
            print(f"{model_name} {length} round {round_ + 1} {label}: {figures}", file=sys.stderr, flush=True)
    summary = {"model": model_name, "length": length, "repeats": repeats}
    for label, figures in runs.items():
        summary[label] = {"prefill_s": statistics.median(f["prefill_s"] for f in figures),
                          "score_s": statistics.median(f["score_s"] for f in figures),
                          "score_over_prefill": round(statistics.median(f["score_s"] / f["prefill_s"]
                                                                        for f in figures), 3)}
    if len(labels) > 1:
        first, second = labels[:2]
        summary[f"score_{first}_over_{second}"] = round(statistics.median(
            a["score_s"] / b["score_s"] for a, b in zip(runs[first], runs[second])), 3)
        reference = torch.load(files[first][0])
        checks = [_same(reference, torch.load(path)) for label in labels[:2] for path in files[label]]
        summary["scores_equal"] = all(c[0] for c in checks)
        summary["kept_entries_differing"] = max(c[1] for c in checks)
        summary["kept_entries"] = checks[0][2]
        summary["max_score_diff"] = max(c[2] for c in checks)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[], help="label=path of a source tree (repeatable; the "
                        "first two are compared)")
    parser.add_argument("--env", action="append", default=[], help="LABEL:NAME=VALUE, an environment variable set "
                        "in that tree's processes only (repeatable)")
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--lengths", nargs="+", type=int, default=[2048, 4096])
    parser.add_argument("--repeats", type=int, default=3, help="rounds of A B per (model, length)")
    parser.add_argument("--out", type=Path, help="append the JSON summaries to this file")
    parser.add_argument("--inner", nargs=3, metavar=("MODEL", "LENGTH", "FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inner:
        print(json.dumps(measure(args.inner[0], int(args.inner[1]), Path(args.inner[2]))))
        return 0
    trees = _trees(args.tree, parser)
    environments = _environments(args.env, trees, parser)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: expected an integer >= 1")
    if any(length < 128 for length in args.lengths):
        parser.error(f"--lengths {args.lengths}: expected lengths >= 128 tokens (the warm-up context is 64)")
    unknown = [name for name in args.models if name not in MODELS]
    if unknown:
        parser.error(f"--models {unknown}: expected some of {', '.join(MODELS)}")
    labels = list(trees)
    compared = len(labels) > 1
    print("| model | tokens | " + " | ".join(f"{label}: prefill s / score s (ratio)" for label in labels)
          + (f" | {labels[0]} / {labels[1]} scoring | scores equal | kept entries differing" if compared else "")
          + " |\n"
          + "|---" * (2 + len(labels) + 3 * compared) + "|", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        for model_name in args.models:
            for length in args.lengths:
                summary = compare(model_name, length, trees, args.repeats, Path(scratch), environments)
                row = f"| {model_name} | {length} | " + " | ".join(
                    f"{s['prefill_s']} / {s['score_s']} ({s['score_over_prefill']})" for s in map(summary.get, labels))
                if compared:
                    row += (f" | {summary[f'score_{labels[0]}_over_{labels[1]}']}x | {summary['scores_equal']} | "
                            f"{summary['kept_entries_differing']} of {summary['kept_entries']}")
                print(row + " |", flush=True)
                text = json.dumps(summary)
                print(text, file=sys.stderr, flush=True)
                if args.out:
                    with args.out.open("a") as handle:
                        handle.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

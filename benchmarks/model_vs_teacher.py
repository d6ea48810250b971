"""Full-cache accuracy of a model against its teacher on the same questions, per task: the hybrid issue's target
("≥ 80 % of the teacher's on each task").

Reads the no-prune rows of two stores written by ``bench compare --press none`` with the same tasks, length,
haystack and seed (so the same contexts and questions), pairs their questions by (task, seed, item, question) and
prints, per task: each model's accuracy (the task's score averaged over questions) with a 95 % interval — Wilson's
where every score is 0 or 1, a bootstrap over questions where a question scores a fraction (several values asked
at once) — and the model's share of the teacher's accuracy with a paired-bootstrap 95 %
interval (questions resampled, both models on the same ones).

    python benchmarks/model_vs_teacher.py --teacher TEACHER_STORE --model MODEL_STORE [--out table.md]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
from collections import defaultdict
from pathlib import Path


def rows_of(store: Path) -> dict[tuple, float]:
    """``{(task, seed, item, question): score}`` of the store's no-prune rows (``results.jsonl`` or its ``.gz``)."""
    path = store / "results.jsonl"
    opened = open(path) if path.exists() else gzip.open(store / "results.jsonl.gz", "rt")
    with opened as lines:
        rows = [json.loads(line) for line in lines if line.strip()]
    return {(r["task"], r["seed"], r["item"], r["question"]): float(r["score"]) for r in rows if r["press"] == "none"}


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def mean_interval(scores: list[float], draws: int = 10_000) -> tuple[float, float]:
    """95 % interval of the mean score: Wilson's for 0/1 scores, else a bootstrap over questions."""
    n = len(scores)
    if all(s in (0.0, 1.0) for s in scores):
        return wilson(int(sum(scores)), n)
    rng = random.Random(0)
    means = sorted(sum(scores[rng.randrange(n)] for _ in range(n)) / n for _ in range(draws))
    return means[int(0.025 * draws)], means[int(0.975 * draws) - 1]


def share_interval(model: list[float], teacher: list[float], draws: int = 10_000) -> tuple[float, float]:
    """Paired-bootstrap 95 % interval of mean(model) / mean(teacher)."""
    rng = random.Random(0)
    n, shares = len(model), []
    for _ in range(draws):
        pick = [rng.randrange(n) for _ in range(n)]
        denominator = sum(teacher[i] for i in pick)
        if denominator > 0:
            shares.append(sum(model[i] for i in pick) / denominator)
    shares.sort()
    return shares[int(0.025 * len(shares))], shares[int(0.975 * len(shares)) - 1]


def table(teacher: dict, model: dict) -> str:
    """Markdown: one row per task of both stores."""
    tasks = defaultdict(list)
    for key in sorted(teacher.keys() & model.keys()):
        tasks[key[0]].append(key)
    lines = ["| task | questions | teacher % [95 %] | model % [95 %] | model / teacher [paired 95 %] |",
             "|---|---|---|---|---|"]
    for task, keys in sorted(tasks.items()):
        t, m = [teacher[k] for k in keys], [model[k] for k in keys]
        n = len(keys)
        cells = []
        for scores in (t, m):
            low, high = mean_interval(scores)
            cells.append(f"{100 * sum(scores) / n:.1f} [{100 * low:.1f}, {100 * high:.1f}]")
        share = sum(m) / sum(t) if sum(t) else float("nan")
        low, high = share_interval(m, t)
        lines.append(f"| {task} | {n} | {cells[0]} | {cells[1]} | {share:.2f} [{low:.2f}, {high:.2f}] |")
    lines.append("\nAccuracy intervals: Wilson's where every score is 0 or 1, else a bootstrap over questions.")
    missing = len(teacher.keys() ^ model.keys())
    if missing:
        lines.append(f"\n{missing} questions are in one store only and left out.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", type=Path, required=True)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    text = table(rows_of(args.teacher), rows_of(args.model))
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()

"""The needle recall table of a report: how much of the needle sentences and of the answers each method's children
kept, per attention layer, from the rows' recall fields (:mod:`bench.run.needles` measures them)."""

from __future__ import annotations

from collections import defaultdict

from ..store.row_fields import method_of
from .markdown_text import escaped


def needle_markdown(rows: list[dict], per_layer: bool = True) -> str:
    """Needle recall by method and kept fraction: the share of the needle sentences' tokens and of the answers'
    tokens that children keep, per attention layer (mean over heads, questions and items), with the mean
    percentile rank of the answer tokens under the press's scores; empty without NIAH rows."""
    values: dict[str, dict[tuple, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for row in rows:
        if row.get("answer_recall_layers"):
            key = (method_of(row), float(row["keep_fraction"]))
            for field in ("needle_recall_layers", "answer_recall_layers", "answer_rank_layers"):
                for layer, heads in (row.get(field) or {}).items():
                    values[field][key][layer] += heads
    if not values:
        return ""
    sentence, answer, rank = (values[f] for f in ("needle_recall_layers", "answer_recall_layers",
                                                  "answer_rank_layers"))
    layers = sorted({layer for by_layer in answer.values() for layer in by_layer}, key=int)
    shown = layers if per_layer else []
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    rank_note = ("; per layer, the rank of the answer tokens under the press's scores (0 = top, 0.5 = chance)"
                 if per_layer else "")
    lines = [f"### Needle recall (%): answer tokens kept / needle-sentence tokens kept{rank_note}", "",
             "| " + " | ".join(["method", "p", "all layers"] + [f"layer {layer}" for layer in shown]) + " |",
             "|---|---|---|" + "---|" * len(shown)]
    for key in sorted(answer):
        cells = []
        for layer in shown:
            cell = f"{100 * mean(answer[key][layer]):.0f} / {100 * mean(sentence[key][layer]):.0f}"
            cells.append(cell + (f" (rank {mean(rank[key][layer]):.2f})" if rank[key].get(layer) else ""))
        overall = ([v for layer in layers for v in answer[key][layer]],
                   [v for layer in layers for v in sentence[key][layer]])
        both = f"{100 * mean(overall[0]):.0f} / {100 * mean(overall[1]):.0f}"
        lines.append("| " + " | ".join([escaped(key[0]), f"{key[1]:g}", both] + cells) + " |")
    return "\n".join(lines) + "\n"

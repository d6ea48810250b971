"""Needle recall: which of the answer-bearing entries a compacted child still holds, and how each press ranked them.

A NIAH question's answer is carried by its needle sentences (``Question.needles``), and within them by the
answer's own tokens (the value). Those are the entries a child must keep to answer from the cache: the recall of
the sentence's and of the answer's tokens per attention layer and KV head, and the percentile rank of the
answer's tokens under the press's scores, say where a method loses a fact — which layer, which head — when its
accuracy drops.
"""

from __future__ import annotations

import torch

from runtime import KeepPlan


def needle_positions(encode, context: str, needles: list[str], answers: list[str] | None = None) -> torch.Tensor:
    """``[m]`` sorted context positions of the tokens of every needle sentence (first occurrence of each), or, with
    ``answers``, of the answer strings inside those sentences only.

    Parameters
    ----------
    encode : callable
        ``text -> list[int]``, the tokenizer the context was encoded with; a span's tokens are those between the
        encodings of the context up to its start and up to its end.
    """
    positions: set[int] = set()

    def add(start: int, end: int) -> None:
        positions.update(range(len(encode(context[:start])), len(encode(context[:end]))))

    for sentence in needles:
        start = context.find(sentence)
        if start < 0:
            raise ValueError(f"needle sentence {sentence!r} is not in the context")
        if answers is None:
            add(start, start + len(sentence))
        for answer in answers or ():
            offset = sentence.find(answer)
            if offset >= 0:
                add(start + offset, start + offset + len(answer))
    return torch.tensor(sorted(positions), dtype=torch.long)


def needle_recall(plan: KeepPlan, positions: torch.Tensor) -> dict[str, list[float]]:
    """``{str(layer): [recall per KV head]}``: the fraction of ``positions`` each head of each layer keeps."""
    return {str(layer): [float(torch.isin(positions, kept).float().mean()) for kept in heads]
            for layer, heads in plan.layers.items()}


def needle_rank(scores: dict[int, torch.Tensor], positions: torch.Tensor, protected: int) -> dict[str, list[float]]:
    """``{str(layer): [mean percentile rank per KV head]}`` of the entries at ``positions`` (a needle's, its
    answer's) under a press's body scores ``[H_kv, n_body]``: 0 = scored above every other entry, 1 = below all (ties
    count half)."""
    body = positions - protected
    out = {}
    for layer, layer_scores in scores.items():
        s = layer_scores.float()
        picked = s[:, body]  # [H_kv, m]
        above = (s[:, None, :] > picked[..., None]).sum(-1) + 0.5 * ((s[:, None, :] == picked[..., None]).sum(-1) - 1)
        out[str(layer)] = (above.float() / max(s.shape[1] - 1, 1)).mean(-1).tolist()
    return out

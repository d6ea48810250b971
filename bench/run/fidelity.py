"""How much a compacted cache changed the model: teacher-forced answer likelihood and distribution shift.

For one question, the prompt is followed by the reference answer (its first reference) and the next-token
distributions at the answer's positions are read from the full cache and from a child. Unlike accuracy these are
defined on tasks the model fails too, and they move continuously with every evicted entry.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.session import CachedContext


def reference_text(prefix: str, answer: str) -> str:
    """The continuation teacher-forced after a question: the answer, after a space unless the prompt ends with
    whitespace (the answer prefix of the task templates ends without one)."""
    return answer if not prefix or prefix[-1].isspace() else " " + answer


def answer_log_probs(cache: CachedContext, prompt_ids: torch.Tensor, answer_ids: torch.Tensor) -> torch.Tensor:
    """``[A, V]`` float32 log-probabilities of the next token at each of the ``A`` answer positions.

    Parameters
    ----------
    cache : CachedContext
        A parent or child; it is not changed.
    prompt_ids, answer_ids : torch.Tensor
        ``[L]`` and ``[A]`` token ids.
    """
    log_probs = cache.log_probs(torch.cat([prompt_ids, answer_ids]))
    start = prompt_ids.numel() - 1  # the distribution after prompt token L - 1 predicts the first answer token
    return log_probs[start : start + answer_ids.numel()]


def log_probs_of(logits: torch.Tensor) -> torch.Tensor:
    """``[..., A, V]`` logits at the answer positions -> the float32 log-probabilities the fidelity metrics read."""
    return logits.float().log_softmax(-1)


@dataclass
class FullCacheReference:
    """What every child of one question is compared with: the full cache's answer distributions and answer.

    Attributes
    ----------
    answer_ids : torch.Tensor
        ``[A]`` reference answer tokens.
    log_probs : torch.Tensor
        ``[A, V]`` the full cache's log-probabilities at the answer positions.
    greedy_tokens : list[int]
        The full cache's greedy answer.
    """

    answer_ids: torch.Tensor
    log_probs: torch.Tensor
    greedy_tokens: list[int]

    @property
    def answer_nll(self) -> float:
        return _nll(self.log_probs, self.answer_ids)


def _nll(log_probs: torch.Tensor, answer_ids: torch.Tensor) -> float:
    return float(-log_probs.gather(1, answer_ids.to(log_probs.device)[:, None]).sum())


def fidelity(reference: FullCacheReference, log_probs: torch.Tensor, greedy_tokens: list[int]) -> dict:
    """The four fidelity fields of a result row for a child's ``[A, V]`` ``log_probs`` and greedy answer.

    ``answer_nll`` (summed over the answer tokens), ``delta_nll`` (child − full cache), ``kl`` (mean over the
    answer positions of KL(full ‖ child), nats) and ``agree`` (same greedy answer as the full cache).
    """
    nll = _nll(log_probs, reference.answer_ids)
    full, p = reference.log_probs, reference.log_probs.exp()
    kl = torch.where(p > 0, p * (full - log_probs), torch.zeros_like(p)).sum(-1).mean()
    return {"answer_nll": nll, "delta_nll": nll - reference.answer_nll, "kl": float(kl),
            "agree": greedy_tokens == reference.greedy_tokens}

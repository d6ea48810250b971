"""What answering children as one padded batch holds, in bytes (:func:`batch_nbytes`), and the groups a memory
budget allows (:func:`groups_within`): a context's plans in consecutive groups, each answered as one
:meth:`runtime.batch.PaddedBatch.forks` and released before the next group's children are forked.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from .options import whole
from .plan import KeepPlan
from .session import Parent

DEFAULT_MEMORY_BUDGET = 256 * 2**20
"""Bytes a group of children answered together may hold by default (:func:`groups_within`): about a fifth of
kvpress's whole process on the real-model side by side (1,245 MiB with SmolLM2-135M at 2,048 tokens,
``docs/kvpress_side_by_side_real.md``), so that a context's children add at most that to its parent."""

Tag = TypeVar("Tag")


@dataclass(frozen=True)
class BatchBytes:
    """What answering some forks of a parent as one :meth:`~runtime.batch.PaddedBatch.forks` holds
    (:func:`batch_nbytes`), in bytes.

    Attributes
    ----------
    padded : int
        The padded copy: every member's keys, values, positions and validity, each attention layer padded to its
        longest head in the group, and its recurrent states.
    child : int
        The largest child, held with the padded copy while it is copied into its place.
    answering : int
        What answering adds: per member the keys and values of the question and answer tokens in every attention
        layer, one layer's attention weights for the question (every query head's logits over the padded cache and
        the tokens, about three float32 copies of them: logits, masked, softmax), the vocabulary logits a pass keeps
        (one row a step, or one per token of a teacher-forced continuation) and their log-probabilities, and the
        recurrent states a step makes anew.
    """

    padded: int
    child: int
    answering: int

    @property
    def peak(self) -> int:
        """The height: the padded copy with a child being forked into it, or with what answering adds."""
        return self.padded + max(self.child, self.answering)


def batch_nbytes(parent: Parent, counts: list[dict[int, list[int]]], tokens: int, forced: int = 0) -> BatchBytes:
    """What answering the forks of ``parent`` with ``counts`` as one :meth:`~runtime.batch.PaddedBatch.forks` holds.

    Parameters
    ----------
    parent : Parent
    counts : list[dict[int, list[int]]]
        Per member, the kept body entries of every attention layer's KV heads (:meth:`KeepPlan.counts`); the
        ``parent.protected`` leading entries come on top of each.
    tokens : int
        The most tokens a member's answer appends to its cache: the question with its answer, or with its
        teacher-forced continuation.
    forced : int
        The tokens of a teacher-forced continuation (:meth:`~runtime.batch.PaddedBatch.answer_and_follow`), whose
        logits are kept; 0 for none.
    """
    keys, _, positions = next(iter(parent.kv.values())).head(0)
    vector = keys.shape[-1] * keys.element_size()  # one key, or one value
    entry = 2 * vector + positions.element_size()  # a stored entry; padded, it has a bool validity besides
    heads, recurrent = parent.adapter.geometry.num_kv_heads, parent.recurrent_nbytes
    kept = [{layer: [c + parent.protected for c in per_head] for layer, per_head in member.items()}
            for member in counts]
    longest = {layer: max(max(member[layer]) for member in kept) for layer in kept[0]}
    tail = tokens * len(longest) * heads * 2 * vector
    weights = 3 * parent.adapter.geometry.num_heads * tokens * (max(longest.values()) + tokens) * 4
    rows = max(forced, 1) * parent.last_logits.shape[-1]
    logits = rows * (parent.last_logits.element_size() + 4)  # and their float32 log-probabilities
    return BatchBytes(
        padded=len(kept) * (heads * sum(longest.values()) * (entry + 1) + recurrent),
        child=entry * max(sum(map(sum, member.values())) for member in kept) + recurrent,
        answering=len(kept) * (tail + weights + logits + 2 * recurrent),
    )


def groups_within(parent: Parent, plans: Iterable[tuple[Tag, KeepPlan]], tokens: int, forced: int = 0,
                  budget: int = DEFAULT_MEMORY_BUDGET, most: int | None = None
                  ) -> Iterator[list[tuple[Tag, KeepPlan]]]:
    """``plans`` in consecutive groups, each as long as its :func:`batch_nbytes` peak stays within ``budget`` bytes (and
    ``most`` plans), for :meth:`~runtime.batch.PaddedBatch.forks`: a context then holds one group's batch at a time,
    answered and released before the next group's children are forked. A plan over the budget alone is a group of its
    own. Plans of similar size side by side pad least.

    ``plans`` is read lazily, one plan past the group it yields: the next group's plans are made after the caller
    has answered this one.

    Parameters
    ----------
    parent : Parent
        The context the plans fork.
    plans : Iterable[tuple[Tag, KeepPlan]]
        Each plan with what the caller knows it by (its method).
    tokens, forced : int
        As in :func:`batch_nbytes`.
    budget : int
        Bytes, at least 1.
    most : int or None
        Plans of a group at most (None: no limit).
    """
    tokens = whole(tokens, "tokens", 0, text=False)
    forced = whole(forced, "forced", 0, text=False)
    budget = whole(budget, "the memory budget (bytes)", 1, text=False)
    most = None if most is None else whole(most, "children answered together", 1, text=False)
    return _groups(parent, plans, tokens, forced, budget, most)


def _groups(parent: Parent, plans: Iterable[tuple[Tag, KeepPlan]], tokens: int, forced: int, budget: int,
            most: int | None) -> Iterator[list[tuple[Tag, KeepPlan]]]:
    """:func:`groups_within` once its arguments are checked (a generator checks nothing until it is first read)."""
    group: list[tuple[Tag, KeepPlan]] = []
    counts: list[dict[int, list[int]]] = []
    for tag, plan in plans:
        wanted = counts + [plan.counts()]
        full = most is not None and len(group) == most
        if group and (full or batch_nbytes(parent, wanted, tokens, forced).peak > budget):
            yield group
            group, wanted = [], wanted[-1:]
        group.append((tag, plan))
        counts = wanted
    if group:
        yield group

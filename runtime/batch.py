"""Many children answered as one batch: the question and every decode step run once for all.

Decoding a small hybrid is bound by per-layer Python work and by reading the weights, not by arithmetic, so children
that differ only in which entries they keep (other presses, allocators, kept fractions) are answered together, and
so are the children of different contexts (the sampled futures of several labelling windows). Their caches are
padded to one shape per layer (padding masked out of attention, so every child attends to exactly its own entries),
each goes on from its own RoPE position, and the batch-of-one layer loop (:func:`runtime.forward.forward_chunk`) is
vectorised over the children with ``torch.func.vmap``. Results equal answering each child alone up to
floating-point reassociation. How many children one batch may hold within a memory budget: :mod:`runtime.batch_memory`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch.func import vmap

from .decoding import Answer, chosen_token, decode_budget, stop_tokens
from .forward import SequenceState, forward_chunk
from .gdn import RecurrentState
from .kv import LayerKV
from .plan import KeepPlan
from .session import CachedContext, Parent, _as_ids


class _Slots:
    """The tensors of a padded batch, one slot per child: per attention layer keys and values ``[B, H, longest, d]``
    (zeros where padding) and positions ``[B, H, longest]`` (-1 where padding), every head padded to ``longest[layer]``;
    per recurrent layer its states ``[B, ...]``. Each child is copied into its slot (:meth:`place`), so the batch can
    be filled one child at a time, each released before the next exists.

    Parameters
    ----------
    like : SequenceState
        A state of the same model (dtypes, head dimensions, recurrent states' shapes).
    size : int
        Children.
    longest : dict[int, int]
        Per attention layer, the most entries of any head of any child.
    """

    def __init__(self, like: SequenceState, size: int, longest: dict[int, int]):
        self.base = {}
        for layer, length in longest.items():
            keys, values, positions = like.base[layer].head(0)
            shape = (size, like.base[layer].num_heads, length)
            self.base[layer] = (keys.new_zeros(*shape, keys.shape[-1]), values.new_zeros(*shape, values.shape[-1]),
                                positions.new_full(shape, -1))
        self.recurrent = {layer: (state.conv.new_empty(size, *state.conv.shape),
                                  state.recurrent.new_empty(size, *state.recurrent.shape))
                          for layer, state in like.recurrent.items()}

    def place(self, b: int, state: SequenceState) -> None:
        """Copy a child's stored entries and recurrent states into slot ``b``."""
        for layer, (keys, values, positions) in self.base.items():
            for h in range(keys.shape[1]):
                k, v, i = state.base[layer].head(h)
                keys[b, h, : k.shape[0]], values[b, h, : v.shape[0]], positions[b, h, : i.shape[0]] = k, v, i
        for layer, (conv, recurrent) in self.recurrent.items():
            conv[b], recurrent[b] = state.recurrent[layer].conv, state.recurrent[layer].recurrent

    def padded(self) -> tuple[dict, dict]:
        """Per attention layer ``(keys, values, positions, valid)``, per recurrent layer ``(conv, recurrent)``."""
        return {layer: (*tensors, tensors[2] >= 0) for layer, tensors in self.base.items()}, self.recurrent


def _step(adapter, all_logits: bool):
    """One chunk through the layer loop for a single child from RoPE position ``position`` (an int shared by the
    batch, or the child's 0-d tensor), as a pure function of its tensors (for ``vmap``)."""

    def step(base, tail, gdn, ids, position):
        state = SequenceState({layer: LayerKV(*entries) for layer, entries in base.items()}, dict(tail),
                              {layer: RecurrentState(*g) for layer, g in gdn.items()}, position)
        with warnings.catch_warnings():
            # vmap has no batching rule for fused attention with a mask and loops over the children instead: no
            # slower than explicit attention logits here (8 children of a 2K context: 0.96 s against 1.05 s)
            warnings.filterwarnings("ignore", ".*batching rule for aten::_scaled_dot_product", UserWarning)
            logits = forward_chunk(adapter, state, ids, all_logits=all_logits)
        return logits, dict(state.tail), {layer: (g.conv, g.recurrent) for layer, g in state.recurrent.items()}

    return step


def _check(children: list[CachedContext]) -> None:
    if not children:
        raise ValueError("give at least one child")
    first = children[0]
    for child in children:
        if child.adapter.model is not first.adapter.model:
            raise ValueError("children answered as one batch must come from the same model")
        if any(kv.valid is not None for kv in child.kv.values()):
            raise ValueError("a padded batch cache cannot be batched again")


def _in_dim(position) -> int | None:
    """vmap's input axis of a RoPE position: None for one int shared by the batch, 0 for a tensor of one each."""
    return 0 if isinstance(position, torch.Tensor) else None


class PaddedBatch:
    """Children padded to one shape once, then asked question after question.

    Parameters
    ----------
    children : list[CachedContext]
        Children of one model: forks of one prefilled context (any presses, allocators, kept fractions), or of
        several; their caches are not changed.
    """

    def __init__(self, children: list[CachedContext]):
        _check(children)
        states = [child._live_state() for child in children]
        longest = {layer: max(max(state.base[layer].lengths()) for state in states) for layer in states[0].base}
        slots = _Slots(states[0], len(states), longest)
        for b, state in enumerate(states):
            slots.place(b, state)
        self._hold(children[0], [state.next_position for state in states], slots)

    @classmethod
    def forks(cls, parent: Parent, plans: list[KeepPlan],
              forked: Callable[[int, CachedContext], None] | None = None) -> PaddedBatch:
        """The forks of ``parent`` by ``plans`` as one batch, each forked into its place and released before the
        next is forked: the batch and one child are held at a time, not every child besides (what
        :class:`PaddedBatch` of the children would hold). The batch equals that of the children.

        Parameters
        ----------
        parent : Parent
        plans : list[KeepPlan]
            One per member.
        forked : Callable[[int, CachedContext], None], optional
            Sees member ``i``'s child before it is released (its bytes, say).
        """
        if not plans:
            raise ValueError("give at least one plan")
        state = parent._live_state()
        counts = [plan.counts() for plan in plans]
        longest = {layer: parent.protected + max(max(member[layer]) for member in counts) for layer in state.base}
        slots = _Slots(state, len(plans), longest)
        for b, plan in enumerate(plans):
            child = parent.fork(plan)
            slots.place(b, child._live_state())
            if forked is not None:
                forked(b, child)
            child.release()
        batch = cls.__new__(cls)
        batch._hold(parent, [state.next_position] * len(plans), slots)
        return batch

    def _hold(self, first: CachedContext, positions: list[int], slots: _Slots) -> None:
        self.size = len(positions)
        self.adapter, self.tokenizer = first.adapter, first.tokenizer
        # one int when the children share their position (forks of one context); one each otherwise
        self.position = (positions[0] if len(set(positions)) == 1
                         else torch.tensor(positions, device=self.adapter.device))
        self.base, self.recurrent = slots.padded()

    def _last_position(self) -> int:
        """The furthest next position of the children: the positions a question and its answer start from."""
        return int(self.position.max()) if isinstance(self.position, torch.Tensor) else self.position

    def _members(self, members: list[int] | None) -> tuple[dict, dict, int | torch.Tensor]:
        """The padded tensors and the positions of ``members`` (indices into the children; None: all)."""
        if members is None or members == list(range(self.size)):
            return self.base, self.recurrent, self.position
        index = torch.tensor(members)
        pick = lambda t: t.index_select(0, index.to(t.device))  # noqa: E731
        return ({layer: tuple(pick(t) for t in entries) for layer, entries in self.base.items()},
                {layer: tuple(pick(t) for t in g) for layer, g in self.recurrent.items()},
                pick(self.position) if isinstance(self.position, torch.Tensor) else self.position)

    def logits(self, question_ids, members: list[int] | None = None) -> torch.Tensor:
        """``[B, L, V]`` logits of every question token for each member."""
        ids = _as_ids(question_ids, self.adapter, "question_ids")
        base, gdn, position = self._members(members)
        logits, _, _ = vmap(_step(self.adapter, True), in_dims=(0, None, 0, None, _in_dim(position)))(
            base, {}, gdn, ids, position)
        return logits

    def answer_and_follow(self, question_ids, continuation_ids, max_new_tokens: int,
                          eos_token_id: int | list[int] | None = None, members: list[int] | None = None
                          ) -> tuple[list[Answer], torch.Tensor | None]:
        """Greedy answers of ``members`` (None: every child) to one question, decoded together until every one has
        stopped, and the logits of a teacher-forced ``continuation_ids`` after the question, from one pass over the
        question: the greedy decode and the forced continuation both continue from its state.

        Each answer is what :meth:`CachedContext.answer` gives that child alone (tokens after its end of sequence
        are computed for the batch but dropped).

        Returns
        -------
        answers : list[Answer]
            One per member.
        logits : torch.Tensor or None
            ``[B, A, V]``: ``logits[:, i]`` predicts continuation token ``i`` (what :meth:`logits` gives at the
            positions from the question's last token on); None without a continuation.
        """
        ids = _as_ids(question_ids, self.adapter, "question_ids")
        max_new_tokens = decode_budget(max_new_tokens, self.adapter.config, self._last_position(), ids.numel())
        stop = stop_tokens(eos_token_id)
        base, gdn, position = self._members(members)
        logits, tail, gdn = vmap(_step(self.adapter, False), in_dims=(0, None, 0, None, _in_dim(position)))(
            base, {}, gdn, ids, position)
        position = position + ids.numel()
        followed = None
        if continuation_ids is not None:
            forced = _as_ids(continuation_ids, self.adapter, "continuation_ids")
            followed = logits
            if forced.numel() > 1:  # the states are values here: the forced pass leaves the decode's state untouched
                rest, _, _ = vmap(_step(self.adapter, True), in_dims=(0, 0, 0, None, _in_dim(position)))(
                    base, tail, gdn, forced[:-1], position)
                followed = torch.cat([logits, rest], 1)
        return self._decode(logits, base, tail, gdn, position, max_new_tokens, stop, None), followed

    def sample(self, first_tokens: list[int], max_new_tokens: int, eos_token_id: int | list[int] | None = None,
               choose: list | None = None) -> list[Answer]:
        """Continuations of every child, each from its own first token, decoded together until every one has
        stopped.

        Member ``b`` is what :meth:`CachedContext.answer` gives child ``b`` alone for the question
        ``[first_tokens[b]]`` with ``choose[b]``: each chooser sees only its own member's logits, once per token
        of that member, so a seeded sampler draws the same sequence as it would alone.

        Parameters
        ----------
        first_tokens : list[int]
            One token per child (e.g. each a sample from the context's last logits).
        max_new_tokens : int
            Tokens generated after each member's first token (as :meth:`CachedContext.answer`'s, for which the
            first token is the question).
        eos_token_id : int, list[int] or None
        choose : list or None
            One callable per child mapping ``[V]`` logits to the next token (default: argmax for all).

        Returns
        -------
        list[Answer]
            One per child.
        """
        max_new_tokens = decode_budget(max_new_tokens, self.adapter.config, self._last_position(), 1,
                                       "the first token")
        if len(first_tokens) != self.size or (choose is not None and len(choose) != self.size):
            raise ValueError(f"give one first token (got {len(first_tokens)}) and one chooser (got "
                             f"{len(choose) if choose is not None else 'none'}) per child ({self.size})")
        ids = torch.tensor(first_tokens, device=self.adapter.device)[:, None]
        stop = stop_tokens(eos_token_id)
        logits, tail, gdn = vmap(_step(self.adapter, False), in_dims=(0, None, 0, 0, _in_dim(self.position)))(
            self.base, {}, self.recurrent, ids, self.position)
        return self._decode(logits, self.base, tail, gdn, self.position + 1, max_new_tokens, stop, choose)

    def _decode(self, logits, base, tail, gdn, position: int | torch.Tensor, max_new_tokens: int, stop: set,
                choose: list | None) -> list[Answer]:
        """The decode loop from ``[B, 1, V]`` logits until every member has said a ``stop`` token or
        ``max_new_tokens`` tokens; ``choose`` as in :meth:`sample` (None: argmax)."""
        count = logits.shape[0]
        tokens: list[list[int]] = [[] for _ in range(count)]
        done = [False] * count
        while True:
            last = logits[:, -1]
            chosen = last.argmax(-1)
            if choose is not None:  # a member that has stopped draws nothing more from its chooser
                chosen = torch.tensor([chosen_token(choose[b](last[b]), last.shape[-1]) if not done[b]
                                       else int(chosen[b]) for b in range(count)], device=chosen.device)
            for b, token in enumerate(chosen.tolist()):
                if not done[b]:
                    tokens[b].append(token)
                    done[b] = token in stop or len(tokens[b]) >= max_new_tokens
            if all(done):
                break
            logits, tail, gdn = vmap(_step(self.adapter, False), in_dims=(0, 0, 0, 0, _in_dim(position)))(
                base, tail, gdn, chosen[:, None], position)
            position = position + 1
        return [Answer(t, self.tokenizer.decode([x for x in t if x not in stop]) if self.tokenizer is not None
                       else None) for t in tokens]


def logits_many(children: list[CachedContext], question_ids) -> torch.Tensor:
    """``[B, L, V]`` logits of every question token for each child (the caches are unchanged)."""
    return PaddedBatch(children).logits(question_ids)


def answer_many(children: list[CachedContext], question_ids, max_new_tokens: int,
                eos_token_id: int | list[int] | None = None) -> list[Answer]:
    """Greedy answers of every child to one question (:meth:`PaddedBatch.answer_and_follow`)."""
    return answer_and_follow_many(children, question_ids, None, max_new_tokens, eos_token_id)[0]


def answer_and_follow_many(children: list[CachedContext], question_ids, continuation_ids, max_new_tokens: int,
                           eos_token_id: int | list[int] | None = None) -> tuple[list[Answer], torch.Tensor | None]:
    """:meth:`PaddedBatch.answer_and_follow` of every child, for one question."""
    return PaddedBatch(children).answer_and_follow(question_ids, continuation_ids, max_new_tokens, eos_token_id)

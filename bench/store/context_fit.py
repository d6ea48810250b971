"""Whether a row's context fits the length it names, as the task builder fits one: a RULER item's haystack grows by
whole units (a line, a sentence, a document) for as long as the context, its longest question and that answer's
budget take at most ``length`` tokens (:func:`workloads.tasks.items.fit_units`). So the context is shorter than the
length less the answer's budget, and longer than that less one question and one more unit — a row whose length was
edited after it ran names a length its context was never fitted to (probe 13: a 384-token run's every row edited to
4096 passed verify and was published into the collection's group of 4096 tokens)."""

from __future__ import annotations

from workloads.tasks.ruler import TASKS, answer_budget

FIT_SLACK = 1024
"""The most tokens a question's prompt and one haystack unit take together, with a margin: a prompt is a sentence or
two and the assistant's turn (under 300 characters), a unit a line, a generated document or a real text's sentence of
at most 400 characters (:mod:`workloads.haystacks`); the contexts of every RULER task at 256 to 8192 tokens leave at
most 593 tokens of a byte-level model's length unfilled beside the answer's budget."""
FILLED = 3
"""A context takes at least 1/FILLED of the length less the answer's budget: it holds the header, the needles and at
least one unit, so a unit or a question that fills the rest is no longer than it (the least share measured: 0.37,
a byte-level model's single needle in a real text at 256 tokens)."""


def fit_problem(row: dict) -> str | None:
    """What is wrong with a RULER row's ``n_context`` for its ``length`` (None where it fits, or where the row records
    no context size): at most the length less the answer's budget (:func:`~workloads.tasks.ruler.answer_budget`)
    and one token of question; and at least the larger of 1/:data:`FILLED` of that and that less
    :data:`FIT_SLACK` — a context is filled until one more unit would not fit, so it falls short by less than a
    question and a unit, and it holds at least one unit, no shorter than a unit or a question that fills the rest.
    Both bounds hold of every context the builder makes, so the larger does (probe 14: the smaller, negative below
    some 1050 tokens, let a 384-token run relabelled 1024, or a 2048-token one relabelled 4096, pass). SCBench items
    are cut to the length, never filled up to it: only its bound applies (:mod:`bench.store.row_checks`)."""
    n, length = row.get("n_context"), row["length"]
    if n is None or row["task"] not in TASKS:
        return None
    budget = answer_budget(row["task"], row["profile"])
    room = length - budget  # the context and its longest question
    if n >= room:
        return (f"n_context={n} (expected at most {room - 1} at length={length}: the context, its longest question "
                f"and the answer's budget of {budget} tokens fit the length)")
    least = max(room // FILLED, room - FIT_SLACK)
    if n < least:
        return (f"n_context={n} (expected at least {least} at length={length}: the context is filled with haystack "
                f"until one more unit would not fit beside its question and the answer's budget of {budget} tokens, "
                "so a row this short ran at another length)")
    return None

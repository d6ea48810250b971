"""One context, one text: every row of one model that answered one item of one task at one length read the same
context, whatever method, run or code answered it, so they agree on its size and digest. A row whose length or item
was edited after it ran names a context it never read (probe 13: a 384-token run's rows edited to 4096 tokens were
published into the collection's group of 4096 tokens beside that group's own 3940-token contexts).

The context is built from the task, its profile, the length, the item, the seed and the haystack, and counted with
the model's tokenizer (one ``weights`` fingerprint covers it), by code that has not changed what it builds since rows
named their context's digest: the committed collection holds 650 contexts answered under two codes or more, each
one text. A haystack of real text reads the machine's files, so a method run elsewhere may have read another text: it
joins no group of this one (``bench publish`` says so of one key, this of any row of the context)."""

from __future__ import annotations

from runtime.errors import UsageError

from .result_store import ResultStore
from .row_fields import CONTEXT_SHA

CONTEXT_KEY = ("model", "weights", "profile", "length", "task", "item", "seed", "haystack")
"""What fixes the text of a row's context."""
CONTEXT_VALUES = ("n_context", "protected", CONTEXT_SHA)
"""What a row records of its context: its size, its protected prefix and its digest (a row written before a field
was recorded lacks it, and is compared on the others)."""


def check_one_context(stores: list[ResultStore]) -> None:
    """``UsageError`` naming, by file and line, the first row of ``stores`` whose context's size or digest
    (:data:`CONTEXT_VALUES`) differs from that of the first row of the same context (:data:`CONTEXT_KEY`) before it,
    with the value that row holds."""
    first: dict[tuple, tuple[dict, str]] = {}
    for store in stores:
        for row, line in zip(store.rows, store.line_numbers):
            key = tuple(row.get(field) for field in CONTEXT_KEY)
            held, where = first.setdefault(key, (row, f"{store.path}:{line}"))
            field = next((field for field in CONTEXT_VALUES if row.get(field) is not None
                          and held.get(field) is not None and row[field] != held[field]), None)
            if field is not None:
                raise UsageError(
                    f"{store.path}:{line}: {field}={row[field]!r} (expected {held[field]!r}, as {where} holds: rows "
                    f"of {row['model']} (weights {row['weights']}) answer one text for task {row['task']}, item "
                    f"{row['item']}, seed {row['seed']} ({row['haystack']} haystack) at length={row['length']}, "
                    "whatever method or code answered it; one of the two was changed after it was written, or ran "
                    "on another machine's text: restore it, or publish it apart)")

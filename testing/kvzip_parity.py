"""KVzip against kvpress's ``KVzipPress``: the same kept positions in every (layer, KV head) of a model.

kvpress 0.5.5's ``KVzipPress`` (non-layerwise) runs its reconstruction passes after the prefill
(``"\\n\\nRepeat the previous context exactly."``, then the chat template's assistant turn, then the context chunk),
scores each context entry by its largest attention probability over the reconstruction's queries and the query heads
of its group — the queries see the first ``n_sink`` tokens, the chunk and, causally, themselves — gives the sinks
the highest score, and evicts the ``int(L·H·n·r)`` lowest entries of all layers together (fake compression: the
evicted indices are masked in attention, ``module.masked_key_indices``).

This project's ``kvzip`` press with the ``global`` allocator is the same rule when the protected prefix is
kvpress's sinks: :func:`kvzip_parity` frames the context as kvpress's pipeline does (the chat template's text before
the context), sets ``n_sink`` to that prefix's length and ``protected`` to the same, and asks both for the same
whole-size budget (``L·H·n·r`` an integer, ``r = 1 − p``). ``benchmarks/kvzip_parity.py`` reports it on the real
model, ``tests/presses/test_kvpress_parity.py`` holds it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

import presses
from runtime import encode_text, prefill


@dataclass
class KVzipParity:
    """One comparison at one kept fraction of the whole context (sinks included, as kvpress counts)."""

    keep_fraction: float
    n_context: int
    n_sink: int
    kept_ours: int
    kept_kvpress: int
    heads: int
    heads_differing: int
    entries_differing: int
    differences_are_ties: bool
    kvpress_keeps_our_top_ranked: bool
    """kvpress's kept set is exactly the top of this project's global ranking, cut at kvpress's own count."""
    max_logit_diff: float
    """Between the first answer token's logits of this project's child and of kvpress's masked cache."""


def chat_prefix(tokenizer) -> list[int]:
    """The ids kvpress's pipeline puts before the context: the chat template's text before the user's content
    (found as ``KVzipPress`` finds it, with a dummy context)."""
    dummy, separator = "dummy context", "\n" + "#" * len("dummy context")
    text = tokenizer.apply_chat_template([{"role": "user", "content": dummy + separator}],
                                         add_generation_prompt=True, tokenize=False, enable_thinking=False)
    return encode_text(tokenizer, text.split(separator)[0].split(dummy)[0])


def kvpress_kept(model, ids: torch.Tensor, keep_fraction: float, n_sink: int,
                 question: torch.Tensor) -> tuple[dict[int, list[torch.Tensor]], torch.Tensor]:
    """Per layer, per KV head, the sorted positions kvpress's ``KVzipPress`` keeps of the context ``ids``, and the
    first answer token's logits ``[V]`` of ``question`` after that cache (kvpress's attention patch masks the
    evicted entries, as in its pipeline's generation)."""
    from kvpress import KVzipPress

    press = KVzipPress(compression_ratio=1 - keep_fraction, n_sink=n_sink)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        with press(model):
            model.model(input_ids=ids[None], past_key_values=cache)
        positions = torch.arange(ids.numel(), ids.numel() + question.numel())[None]
        logits = model(input_ids=question[None], past_key_values=cache, position_ids=positions,
                       logits_to_keep=1).logits[0, -1]
    kept = {}
    for layer in model.model.layers:
        module = layer.self_attn
        _, heads, evicted_positions = module.masked_key_indices
        del module.masked_key_indices  # else every later forward of this model would mask them too
        evicted = torch.zeros(model.config.num_key_value_heads, ids.numel(), dtype=torch.bool)
        evicted[heads, evicted_positions] = True
        kept[module.layer_idx] = [torch.nonzero(~row).flatten() for row in evicted]
    return kept, logits


def kvzip_parity(model, tokenizer, body_ids: torch.Tensor, question: torch.Tensor,
                 keep_fraction: float) -> KVzipParity:
    """This project's ``kvzip``/``global`` against kvpress's ``KVzipPress`` on ``chat_prefix + body_ids``."""
    prefix = torch.tensor(chat_prefix(tokenizer))
    ids = torch.cat([prefix, body_ids])
    n, sink = ids.numel(), prefix.numel()
    layers, kv_heads = len(model.model.layers), model.config.num_key_value_heads
    evicted_total = layers * kv_heads * n * (1 - keep_fraction)
    if abs(evicted_total - round(evicted_total)) > 1e-6 or (n * keep_fraction - sink) % 1 > 1e-6:
        raise ValueError(f"keep_fraction={keep_fraction} with {n} context tokens is not a whole budget in both tools")
    theirs, their_logits = kvpress_kept(model, ids, keep_fraction, sink, question)
    parent = prefill(model, ids, protected=sink, tokenizer=tokenizer)
    selection = presses.Selection(parent, "kvzip")
    # the same total: kvpress keeps p·n per head on average with its sinks, this project p_body·(n − sink) + sink
    plan = selection.plan("global", (n * keep_fraction - sink) / (n - sink))
    ours = plan.layers  # body positions; the sinks (protected) are kept besides
    if any(not torch.equal(h[:sink], torch.arange(sink)) for heads in theirs.values() for h in heads):
        raise AssertionError("kvpress evicted one of its sinks")
    theirs = {layer: [h[h >= sink] for h in heads] for layer, heads in theirs.items()}
    heads_differing = entries_differing = 0
    boundary, ties = set(), True
    for layer, heads in ours.items():
        for h, mine in enumerate(heads):
            other = theirs[layer][h]
            if mine.numel() == other.numel() and torch.equal(mine, other):
                continue
            heads_differing += 1
            only = set(mine.tolist()) ^ set(other.tolist())
            entries_differing += len(only)
            boundary.update((layer, h, i) for i in only)
    if boundary:
        # one budget for all layers: a tie is an entry scoring exactly the lowest score this project kept anywhere
        lowest = min(float(selection.scores[layer][h][heads[h] - sink].min()) for layer, heads in ours.items()
                     for h in range(kv_heads) if heads[h].numel())
        ties = all(float(selection.scores[layer][h][i - sink]) == lowest for layer, h, i in boundary)
    # kvpress's own count is int(L·H·n·r) in floating point, which can fall one below the exact product (90·1020·0.7
    # = 64259.99…): then it keeps one entry more than asked. Its kept set is still this project's ranking cut at its
    # count if the scores agree: the global order of this project's scores (stable, as the allocator sorts them)
    order = torch.sort(-torch.cat([selection.scores[layer].float().reshape(-1) for layer in ours]), stable=True)
    n_body = n - sink
    count = sum(h.numel() for heads in theirs.values() for h in heads)
    ranked = torch.zeros(len(ours) * kv_heads * n_body, dtype=torch.bool)
    ranked[order.indices[:count]] = True
    ranked = ranked.view(len(ours), kv_heads, n_body)
    same_ranking = all(torch.equal(torch.nonzero(ranked[i, h]).flatten() + sink, theirs[layer][h])
                       for i, layer in enumerate(ours) for h in range(kv_heads))
    kept_ours = plan.total() + layers * kv_heads * sink
    kept_theirs = sum(h.numel() for heads in theirs.values() for h in heads) + layers * kv_heads * sink
    child = parent.fork(plan)
    logits = child.logits(question)[-1]
    child.release()
    parent.release()
    return KVzipParity(keep_fraction, n, sink, kept_ours, kept_theirs, layers * kv_heads, heads_differing,
                       entries_differing, ties, same_ranking, float((logits - their_logits).abs().max()))

"""Parity with kvpress's own compressed cache on a dense model: for a kvpress press at a kept fraction, which
positions this project's plan keeps against those kvpress's cache holds (read off it bit for bit), whether they
differ only by how exact ties at the boundary are broken, and the first answer token's logits of both.
``benchmarks/kvpress_side_by_side.py`` and ``benchmarks/kvpress_parity_real.py`` report it,
``tests/presses/test_kvpress_parity.py`` holds it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

import presses
from runtime import KeepPlan, prefill

LOGIT_TOLERANCE = 1e-4
"""The largest |Δ| of the first answer token's logits that still counts as parity (float32)."""


@dataclass
class Parity:
    """One (press, kept fraction): how this project's plan and child compare with kvpress's compressed cache.

    Attributes
    ----------
    kept_ours, kept_kvpress : int
        Entries kept per head (the flat allocator's round(p·n); kvpress's ``int(n·(1 − r))``).
    heads, heads_differing : int
        (layer, KV head) pairs, and those whose kept position sets differ.
    differences_are_ties : bool
        Every position kept by one side only has, on both sides' scores, exactly the score of the last entry kept
        (an exact tie at the boundary), and the kept counts are equal: the sides differ in tie-breaking only
        (True when nothing differs).
    differing_layers : list[int]
        The layers with a differing head.
    max_logit_diff : float
        Max |Δ| of the first answer token's logits, over the questions: this project's child against kvpress.
    max_logit_diff_on_kvpress_positions : float
        The same with this runtime forked on the positions kvpress kept: the cache itself against kvpress's.
    """

    press: str
    p: float
    kept_ours: int
    kept_kvpress: int
    heads: int
    heads_differing: int
    differences_are_ties: bool
    differing_layers: list
    max_logit_diff: float
    max_logit_diff_on_kvpress_positions: float

    @property
    def holds(self) -> bool:
        """Kept positions identical and the first answer token's logits within :data:`LOGIT_TOLERANCE`."""
        return self.heads_differing == 0 and self.max_logit_diff <= LOGIT_TOLERANCE


def uncompressed_keys(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """``[H_kv, n, d]`` per layer from a plain transformers prefill (kvpress's pipeline without a press)."""
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model.model(input_ids=ids[None], past_key_values=cache)
    return [layer.keys[0] for layer in cache.layers]


def kvpress_prefill(model, ids: torch.Tensor, press) -> tuple[DynamicCache, dict[int, torch.Tensor]]:
    """kvpress's compressed prefill, as its pipeline runs it, and the scores its hooks computed (``[H_kv, n]``
    per layer; a spy on ``press.score`` records them and returns them unchanged)."""
    scores, score = {}, press.score

    def spy(module, hidden_states, keys, values, attentions, kwargs):
        scores[module.layer_idx] = score(module, hidden_states, keys, values, attentions, kwargs)
        return scores[module.layer_idx]

    press.score = spy
    cache = DynamicCache(config=model.config)
    try:
        with torch.no_grad(), press(model):
            model.model(input_ids=ids[None], past_key_values=cache)
    finally:
        del press.score  # the instance attribute; the class's method again
    return cache, {layer: s[0].float() for layer, s in scores.items()}


def kept_positions(compressed: torch.Tensor, full: torch.Tensor) -> list[torch.Tensor]:
    """Sorted context positions of every compressed key row ``[H_kv, k, d]`` among the full cache's ``[H_kv, n, d]``.

    ``ValueError`` if a row equals no full row bit for bit: then the caches differ in more than which entries
    were kept, and positions cannot be read off them.
    """
    heads = []
    for h in range(full.shape[0]):
        nearest = torch.cdist(compressed[h], full[h]).argmin(-1)
        if not torch.equal(full[h][nearest], compressed[h]):
            raise ValueError(f"head {h}: a compressed key row equals no key row of the uncompressed cache")
        heads.append(torch.sort(nearest).values)
    return heads


def kvpress_first_logits(model, cache: DynamicCache, n: int, question_ids: torch.Tensor) -> torch.Tensor:
    """The first answer token's logits ``[V]``, computed as kvpress's ``generate_answer`` does (positions
    n … n + m − 1 after the compressed cache); the question is cropped off the cache again afterwards."""
    kept = cache.get_seq_length()
    positions = torch.arange(n, n + question_ids.numel())[None]
    with torch.no_grad():
        logits = model(input_ids=question_ids[None], past_key_values=cache, position_ids=positions,
                       logits_to_keep=1).logits[0, -1]
    cache.crop(kept)
    return logits


def _is_tie(scores: torch.Tensor, kept: torch.Tensor, only: set[int]) -> bool:
    """Every position in ``only`` scores exactly what the lowest kept entry of ``kept`` scores."""
    boundary = scores[kept].min()
    return all(bool(scores[i] == boundary) for i in only)


def parity(model, context_ids: torch.Tensor, questions_ids: list[torch.Tensor], name: str, keep_fraction: float,
           parent=None, **options) -> Parity:
    """kvpress's compressed cache against this project's child for ``kvpress:<name>`` at ``keep_fraction``.

    Parameters
    ----------
    model : Qwen3ForCausalLM or LlamaForCausalLM
        A dense model both tools run.
    context_ids, questions_ids : torch.Tensor
        ``[n]`` and one ``[m]`` per question (already framed).
    name : str
        A kvpress press as named here (``kvpress:<name>``), built with ``options``.
    keep_fraction : float
        p; kvpress runs at ``compression_ratio = 1 − p``.
    parent : Parent, optional
        A prefill of ``context_ids`` with ``protected=0`` and the press's evidence (made here when omitted).
    """
    scorer = presses.get(f"kvpress:{name}", **options)
    if parent is None:
        parent = prefill(model, context_ids, protected=0, evidence=scorer.evidence(None))
    selection = presses.Selection(parent, scorer)
    plan = selection.plan("flat", keep_fraction)
    press = type(scorer.press)(**{**vars(scorer.press), "compression_ratio": 1 - keep_fraction})
    cache, their_scores = kvpress_prefill(model, context_ids, press)
    full = uncompressed_keys(model, context_ids)
    layers = parent.adapter.attention_layers
    theirs = {layer: kept_positions(cache.layers[layer].keys[0], full[layer]) for layer in layers}
    differing, ties, differing_layers = 0, True, set()
    for layer in layers:
        for h, ours in enumerate(plan.layers[layer]):
            if torch.equal(ours, theirs[layer][h]):
                continue
            differing += 1
            differing_layers.add(layer)
            mine, yours = set(ours.tolist()), set(theirs[layer][h].tolist())
            ties &= len(mine) == len(yours)
            for scores in (selection.scores[layer][h], their_scores[layer][h]):  # protected=0: body = context
                ties &= _is_tie(scores, ours, mine - yours) and _is_tie(scores, theirs[layer][h], yours - mine)
    on_theirs = parent.fork(KeepPlan(theirs))
    child = parent.fork(plan)
    diff = diff_theirs = 0.0
    for q in questions_ids:
        reference = kvpress_first_logits(model, cache, parent.n, q)
        diff = max(diff, float((child.logits(q)[-1] - reference).abs().max()))
        diff_theirs = max(diff_theirs, float((on_theirs.logits(q)[-1] - reference).abs().max()))
    return Parity(name, keep_fraction, plan.counts()[layers[0]][0], cache.get_seq_length(layers[0]),
                  sum(len(heads) for heads in plan.layers.values()), differing, ties, sorted(differing_layers),
                  diff, diff_theirs)

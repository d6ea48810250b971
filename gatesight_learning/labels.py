"""Future-utility labels (paper Eq. 2, App. B): the joint leave-one-out change of an attention layer's ungated
output over the model's own sampled continuations, in closed form.

For continuation token t, query head j of KV head h's group Q(h) and context entry i, removing i from the softmax
of every head of the group changes the layer output (after ``o_proj``, gate left out) by

    Δr(t, i) = −Σ_j a_j(t,i) / (1 − a_j(t,i)) · W_O^(j) (v_i − o_j(t)),

and U(i) = max_t ‖Δr(t, i)‖. Expanding the squared norm with the cross-head metric M_jk = W_jᵀ W_k gives terms
that depend on the entry alone (v_iᵀ M_jk v_i), on the token alone (o_jᵀ M_jk o_k) and on both (v_iᵀ M_jk o_k), so
no ``[T, n, D]`` tensor is ever formed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime import Parent
from runtime.explicit_attention import attention_probs


@dataclass
class Sampler:
    """Seeded temperature / top-k / top-p sampling of one token from ``[V]`` logits (paper App. B defaults).

    Attributes
    ----------
    temperature : float
        Divides the logits.
    top_p : float
        The smallest set of the top-k tokens whose probability reaches it is sampled from.
    top_k : int
        Tokens considered.
    seed : int
        Seeds the sampler's own generator: one sampler, one reproducible sequence of draws.
    """

    temperature: float = 1.0
    top_p: float = 0.95
    top_k: int = 20
    seed: int = 0

    def __post_init__(self):
        self.generator = torch.Generator().manual_seed(self.seed)

    def __call__(self, logits: torch.Tensor) -> int:
        logits = logits.float() / self.temperature
        values, indices = logits.topk(min(self.top_k, logits.numel()))
        probs = values.softmax(-1)
        keep = probs.cumsum(-1) - probs < self.top_p  # smallest prefix whose mass reaches top_p
        probs = probs * keep
        return int(indices[torch.multinomial(probs / probs.sum(), 1, generator=self.generator)])


class _ContinuationCapture:
    """A forward observer keeping each attention layer's query, gate, keys, values and output of a continuation."""

    wants_recurrent_signals = False

    def __init__(self):
        self.layers: dict[int, dict[str, torch.Tensor]] = {}

    def on_attention(self, layer, hidden, query, gate, keys, values, output):
        self.layers[layer] = {"query": query, "gate": gate, "keys": keys, "values": values, "output": output}


def _continuation_attention(parent: Parent, layer: int, captured: dict,
                            rows: slice) -> tuple[torch.Tensor, ...]:
    """float64 ``a`` ``[H, b, n + t1]``, head outputs ``o`` ``[H, b, d]`` and values ``[H_kv, n + t1, d]`` of the
    continuation tokens ``rows = t0:t1`` (``b`` of them): the keys past the block's last token are cut off, which
    no token of the block sees.

    float64 because an entry holding nearly all of a head's attention (a sink, ``a`` near 1) enters the closed form
    through ``1 / (1 − a)``: in float32 the rounding of the softmax's sum alone moved the closed form and the
    brute-force deletion apart by 2e-4 of the row's largest utility on a pretrained model's window.
    """
    g = parent.adapter.geometry
    stored = parent.kv[layer]
    seen = stored.keys.shape[1] + rows.stop
    keys = torch.cat([stored.keys, captured["keys"]], 1)[:, :seen].double()
    values = torch.cat([stored.values, captured["values"]], 1)[:, :seen].double()
    query = captured["query"][:, rows].double()
    probs = attention_probs(query, keys, parent.adapter.attention_module(layer).scaling, causal_tail=query.shape[1])
    return probs, probs @ values.repeat_interleave(g.group_size, 0), values


LABEL_BLOCK_BYTES = 256 << 20
"""Bound on the largest float64 intermediate of one block of continuation tokens. A label is a max over the tokens,
so a long future (the reconstruction of a long window, as many tokens as the window) is labelled block by block in
memory linear in its length; a future that fits is one block, computed as a whole."""


def token_blocks(tokens: int, heads: int, group: int, entries: int, budget: int = LABEL_BLOCK_BYTES) -> list[slice]:
    """Consecutive blocks of the ``tokens`` continuation tokens whose attention ``[H, b, entries]`` and closed-form
    terms ``[G, G, b, entries]`` (float64) stay within ``budget`` bytes each; at least one token a block."""
    per_token = 8 * entries * max(heads, group * group)
    size = max(1, budget // per_token)
    return [slice(start, min(start + size, tokens)) for start in range(0, tokens, size)]


def _out_proj_blocks(parent: Parent, layer: int) -> torch.Tensor:
    """``[H, D, d]``: each query head's slice W_O^(j) of the output projection, float64 (as the attention)."""
    g = parent.adapter.geometry
    weight = parent.adapter.attention_module(layer).o_proj.weight.double()  # [D, H·d]
    return weight.view(weight.shape[0], g.num_heads, g.head_dim).permute(1, 0, 2)


def closed_form_utility(probs, outputs, values, blocks, num_kv_heads: int, n: int) -> torch.Tensor:
    """Max over the T continuation tokens of ‖Δr(t, i)‖ for the first n entries (the module docstring's closed
    form).

    Parameters
    ----------
    probs : torch.Tensor
        ``[H, T, N]`` attention of the continuation tokens over all N entries (float64 in the labels).
    outputs : torch.Tensor
        ``[H, T, d]`` head outputs.
    values : torch.Tensor
        ``[H_kv, N, d]``.
    blocks : torch.Tensor
        ``[H, D, d]`` output-projection slices (:func:`_out_proj_blocks`).
    num_kv_heads : int
    n : int
        Context entries labelled (the first n of N).

    Returns
    -------
    torch.Tensor
        ``[H_kv, n]``.
    """
    heads = probs.shape[0]
    group = heads // num_kv_heads
    result = []
    for h in range(num_kv_heads):
        js = slice(h * group, (h + 1) * group)
        w = blocks[js]  # [G, D, d]
        metric = torch.einsum("jDa,kDb->jkab", w, w)  # W_jᵀ W_k
        v = values[h, :n]  # [n, d]
        o = outputs[js]  # [G, T, d]
        a = probs[js, :, :n]
        c = a / (1 - a)  # [G, T, n]
        entry = torch.einsum("na,jkab,nb->jkn", v, metric, v)
        cross = torch.einsum("na,jkab,ktb->jktn", v, metric, o)
        token = torch.einsum("jta,jkab,ktb->jkt", o, metric, o)
        quad = entry[:, :, None] - cross - cross.transpose(0, 1) + token[..., None]  # [G, G, T, n]
        squared = torch.einsum("jtn,ktn,jktn->tn", c, c, quad)
        result.append(squared.clamp_min(0).sqrt().amax(0))
    return torch.stack(result)


def brute_force_utility(probs, outputs, values, blocks, num_kv_heads: int, entries: torch.Tensor) -> torch.Tensor:
    """The utility of ``entries`` by deleting each from the softmax of its group and recomputing the output: what
    :func:`closed_form_utility` is checked against.

    Parameters
    ----------
    probs, outputs, values, blocks : torch.Tensor
        As :func:`closed_form_utility`'s.
    num_kv_heads : int
    entries : torch.Tensor
        ``[E]`` entry indices.

    Returns
    -------
    torch.Tensor
        ``[H_kv, E]``.
    """
    heads = probs.shape[0]
    group = heads // num_kv_heads
    result = torch.zeros(num_kv_heads, entries.numel(), dtype=probs.dtype)
    for h in range(num_kv_heads):
        js = slice(h * group, (h + 1) * group)  # deleting an entry of KV head h changes the outputs of js alone
        for col, i in enumerate(entries.tolist()):
            deleted = probs[js].clone()
            deleted[..., i] = 0
            deleted = deleted / deleted.sum(-1, keepdim=True)
            changed = deleted @ values[h] - outputs[js]  # [G, T, d]
            result[h, col] = torch.einsum("jDd,jtd->tD", blocks[js], changed).norm(dim=-1).max()
    return result


CHECKED_TOKENS = 128
"""Future length up to which every one of ``check_entries`` is checked (:func:`utility_labels`): the sampled
futures'. The window asked back (≈ 1,000 tokens) checked eight entries a layer took more time than labelling it."""

CLOSED_FORM_TOLERANCE = 1e-4
"""Largest closed-form error a labelled window may show, in label units (:class:`LabelChecks`). Rounding alone
stays far below it now that the attention is float64 (:func:`_continuation_attention`); in float32 it reached
1.2e-5 on the default model and 2e-4 on two of 236 windows of SmolLM2's distilled hybrid (attention sinks). A wrong
closed form is off by order 1."""


@dataclass
class LabelChecks:
    """What the label pass verified.

    Attributes
    ----------
    max_closed_form_error : float
        Worst difference between the closed-form utility and brute-force deletion on the checked entries, relative
        to the largest utility of the entry's (layer, KV head) row for that continuation: the unit of the
        max-normalised labels (their normaliser, the largest over every continuation, is at least as large, so the
        error in label units is at most this). An absolute bound would not transfer across models: the utilities
        of a pretrained model's layers span 1 to 100 where the default model's stay near 1.
    max_reconstruction_error : float
        Worst absolute difference between the layer output rebuilt from the captured head outputs and the module's.
    covered : bool
        Every label finite and every context entry labelled.
    """

    max_closed_form_error: float = 0.0
    max_reconstruction_error: float = 0.0
    covered: bool = True


@torch.no_grad()
def utility_labels(
    parent: Parent, continuations: list[torch.Tensor], n: int, check_entries: int = 0, seed: int = 0,
    block_bytes: int = LABEL_BLOCK_BYTES,
) -> tuple[dict[int, torch.Tensor], LabelChecks]:
    """Raw (un-normalised) U(i) per attention layer for the first ``n`` prefilled entries.

    Parameters
    ----------
    parent : Parent
        The prefilled document.
    continuations : list[torch.Tensor]
        ``[T]`` token tensors appended after the parent's prompt, each its own branch; U is the max over all.
    n : int
        Context entries labelled.
    check_entries : int
        With > 0, that many random entries per layer are also scored by brute-force deletion in a future of at most
        :data:`CHECKED_TOKENS` tokens; a future k times as long checks k times fewer (at least one): deletion
        costs a pass over the whole future per entry, and a wrong closed form is off by order 1 on any entry.
    seed : int
        Which entries are checked.
    block_bytes : int
        Bound on one block's float64 intermediates (:func:`token_blocks`).

    Returns
    -------
    tuple[dict[int, torch.Tensor], LabelChecks]
        ``{attention layer: [H_kv, n]}`` and what was verified.
    """
    g = parent.adapter.geometry
    labels = {layer: torch.zeros(g.num_kv_heads, n) for layer in parent.adapter.attention_layers}
    checks = LabelChecks()
    generator = torch.Generator().manual_seed(seed)
    for continuation in continuations:
        capture = _ContinuationCapture()
        parent.logits(continuation, observer=capture)
        for layer in parent.adapter.attention_layers:
            captured = capture.layers[layer]
            blocks = _out_proj_blocks(parent, layer)
            n_stored = parent.kv[layer].keys.shape[1]
            size = continuation.numel()
            checked = min(check_entries, max(1, check_entries * CHECKED_TOKENS // size))
            entries = None if not check_entries else torch.randperm(n, generator=generator)[:checked]
            utility = brute = None
            for rows in token_blocks(size, g.num_heads, g.group_size, n_stored + size, block_bytes):
                probs, outputs, values = _continuation_attention(parent, layer, captured, rows)
                gate = None if captured["gate"] is None else captured["gate"][rows]
                rebuilt = parent.adapter.output(layer, outputs.transpose(0, 1).to(captured["output"].dtype), gate)
                checks.max_reconstruction_error = max(checks.max_reconstruction_error,
                                                      float((rebuilt - captured["output"][:, rows]).abs().max()))
                part = closed_form_utility(probs, outputs, values, blocks, g.num_kv_heads, n)
                utility = part if utility is None else torch.maximum(utility, part)
                if entries is not None:
                    part = brute_force_utility(probs, outputs, values, blocks, g.num_kv_heads, entries)
                    brute = part if brute is None else torch.maximum(brute, part)
            labels[layer] = torch.maximum(labels[layer], utility.float())
            if entries is not None:
                scale = utility.amax(-1, keepdim=True).clamp_min(1e-12)
                checks.max_closed_form_error = max(checks.max_closed_form_error,
                                                   float(((brute - utility[:, entries]).abs() / scale).max()))
    checks.covered = all(bool(torch.isfinite(v).all()) and v.shape[1] == n for v in labels.values())
    return labels, checks


def max_normalise(labels: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    """Scale each (layer, KV head) row of ``{layer: [H_kv, n]}`` to max 1 (paper: per document, layer and KV head)."""
    return {layer: u / u.amax(-1, keepdim=True).clamp_min(1e-12) for layer, u in labels.items()}

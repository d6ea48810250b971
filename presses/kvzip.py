"""KVzip (arXiv 2505.23416; ``snu-mllab/KVzip``): score entries by how much a context reconstruction attends to them.

The context body is split into chunks; for each chunk the model is teacher-forced on
``[repeat prompt | chat suffix | chunk]`` against the full context cache, and each layer's queries of those tokens
attend over ``[protected | chunk | repeat tokens (causal)]`` only. An entry's score is the max over queries and
over the query heads of its group; the pass's own attention computes it
(:func:`runtime.explicit_attention.attend_with_key_max`). The pass runs on a branch of the context, so the context
(GDN states included) is exactly as before scoring.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime import CHATML_ASSISTANT_TURN, encode_text
from runtime.errors import UsageError
from runtime.explicit_attention import max_attention

from .base import BranchingContext, Press, Scores


class _ReconstructionAttention:
    """Scores one chunk's entries from a reconstruction pass: the forward attends through
    :func:`runtime.explicit_attention.attend_with_key_max` over ``restricted_keys`` and hands each layer's maxima to
    :meth:`on_attention`."""

    wants_recurrent_signals = False

    def __init__(self, context: BranchingContext, start: int, end: int, scores: Scores):
        self.context, self.start, self.end, self.scores = context, start, end, scores
        self.restricted_keys = (context.protected, start, end)
        # nothing after the last attention layer's mixer feeds a score: the pass stops there (forward_chunk)
        self.last_layer = max(context.adapter.attention_layers)

    def on_attention(self, layer, hidden, query, gate, keys, values, output, restricted_max=None):
        context, g = self.context, self.context.adapter.geometry
        if restricted_max is None:  # the vLLM engine's replay (serving.served_context.Passes): queries and keys only
            stored = context.kv[layer].keys
            restricted = torch.cat([stored[:, : context.protected], stored[:, self.start : self.end], keys], dim=1)
            # softmax in the model dtype, as the official implementation does (the runtime's pass: float32 below
            # it, so that its output stays as accurate as the fused kernel's)
            restricted_max = max_attention(query, restricted, context.adapter.attention_module(layer).scaling,
                                           causal_tail=query.shape[1])
        chunk = restricted_max[:, context.protected : context.protected + self.end - self.start]  # [H, c]
        chunk = chunk.view(g.num_kv_heads, g.group_size, -1).amax(1)
        body = slice(self.start - context.protected, self.end - context.protected)
        self.scores[layer][:, body] = chunk.float()


@dataclass
class KVzipPress(Press):
    """Parameters: ``chunk_size`` (2000), ``prompt`` / ``continue_prompt`` (KVzip's wording), ``suffix`` (the chat
    turn that opens the assistant's reply), ``overlap`` (last tokens of the previous chunk quoted, 8)."""

    chunk_size: int = 2000
    prompt: str = "\n\nRepeat the previous context exactly."
    continue_prompt: str = "\n\nRepeat the part of the previous context exactly, starting with "
    suffix: str = CHATML_ASSISTANT_TURN
    overlap: int = 8
    tokenizer: object = None
    name = "kvzip"
    runs_in_engine = True
    comparable_scale = True
    runs_after_context = True

    def __post_init__(self):
        if isinstance(self.chunk_size, bool) or not isinstance(self.chunk_size, int) or self.chunk_size < 1:
            raise UsageError(f"chunk_size={self.chunk_size!r}: expected an integer >= 1 (context tokens per "
                             "reconstruction pass)")
        if isinstance(self.overlap, bool) or not isinstance(self.overlap, int) or self.overlap < 0:
            raise UsageError(f"overlap={self.overlap!r}: expected an integer >= 0 (tokens of the previous chunk "
                             "quoted)")

    def _encode(self, context: BranchingContext, text: str) -> torch.Tensor:
        tokenizer = self.tokenizer or context.tokenizer
        if tokenizer is None:
            raise ValueError("KVzip needs a tokenizer for its repeat prompt: pass tokenizer= to prefill or the press")
        return torch.tensor(encode_text(tokenizer, text), dtype=torch.long)

    def score(self, context: BranchingContext) -> Scores:
        g = context.adapter.geometry
        n_body = context.n - context.protected
        scores = {layer: torch.zeros(g.num_kv_heads, n_body, device=context.adapter.device)
                  for layer in context.adapter.attention_layers}
        suffix = self._encode(context, self.suffix)
        ids = context.context_ids.cpu()
        for start in range(context.protected, context.n, self.chunk_size):
            end = min(start + self.chunk_size, context.n)
            if start == context.protected:
                prompt = self._encode(context, self.prompt)
            else:
                prompt = torch.cat([self._encode(context, self.continue_prompt), ids[start - self.overlap : start]])
            repeat = torch.cat([prompt, suffix, ids[start:end]])
            context.observe(repeat, _ReconstructionAttention(context, start, end, scores))
        return scores

"""KVzip (arXiv 2505.23416; ``snu-mllab/KVzip``): score entries by how much a context reconstruction attends to them.

The context body is split into chunks; for each chunk the model is teacher-forced on
``[repeat prompt | chat suffix | chunk]`` against the full parent cache, and each layer's queries of those tokens
attend over ``[protected | chunk | repeat tokens (causal)]`` only. An entry's score is the max over queries and
over the query heads of its group. The pass runs on a branch of the parent, so the parent (GDN states included)
is exactly as before scoring.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime import CHATML_ASSISTANT_TURN, Parent, encode_text
from runtime.kv import attention_probs

from .base import Press, Scores


class _ReconstructionAttention:
    wants_gdn_signals = False

    def __init__(self, parent: Parent, start: int, end: int, scores: Scores):
        self.parent, self.start, self.end, self.scores = parent, start, end, scores

    def on_attention(self, layer, hidden, query, gate, keys, values, output):
        parent, g = self.parent, self.parent.adapter.geometry
        stored = parent.kv[layer].keys
        restricted = torch.cat([stored[:, : parent.protected], stored[:, self.start : self.end], keys], dim=1)
        # softmax in the model dtype, as the official implementation does
        probs = attention_probs(query, restricted, parent.adapter.attention_module(layer).scaling,
                                causal_tail=query.shape[1])
        chunk = probs[..., parent.protected : parent.protected + self.end - self.start].amax(1)  # [H, c]
        chunk = chunk.view(g.num_kv_heads, g.group_size, -1).amax(1)
        body = slice(self.start - parent.protected, self.end - parent.protected)
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
    comparable_scale = True

    def _encode(self, parent: Parent, text: str) -> torch.Tensor:
        tokenizer = self.tokenizer or parent.tokenizer
        if tokenizer is None:
            raise ValueError("KVzip needs a tokenizer for its repeat prompt: pass tokenizer= to prefill or the press")
        return torch.tensor(encode_text(tokenizer, text), dtype=torch.long)

    def score(self, parent: Parent) -> Scores:
        g = parent.adapter.geometry
        n_body = parent.n - parent.protected
        scores = {layer: torch.zeros(g.num_kv_heads, n_body, device=parent.adapter.device)
                  for layer in parent.adapter.attention_layers}
        suffix = self._encode(parent, self.suffix)
        ids = parent.context_ids.cpu()
        for start in range(parent.protected, parent.n, self.chunk_size):
            end = min(start + self.chunk_size, parent.n)
            if start == parent.protected:
                prompt = self._encode(parent, self.prompt)
            else:
                prompt = torch.cat([self._encode(parent, self.continue_prompt), ids[start - self.overlap : start]])
            repeat = torch.cat([prompt, suffix, ids[start:end]])
            parent.logits(repeat, observer=_ReconstructionAttention(parent, start, end, scores))
        return scores

"""What the runtime and the presses need to know about a model, behind one small interface.

The per-family projections live here: a new architecture family is one adapter file plus a line in
:data:`ADAPTERS`. Other places read module internals by attribute: the GDN and Mamba2 continuation kernels
(``runtime/gdn.py``, ``runtime/mamba2.py``: ``A_log``, ``dt_bias``, the conv, the mixer's sizes), the static
half-lives (``hybridmodel/half_lives.py``: ``A_log``, ``dt_bias``) and the utility labels' output projection
(``gatesight_learning/labels.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` dims of ``x`` (half-split pairs); the rest pass through.

    Parameters
    ----------
    x : torch.Tensor
        ``[H, L, d]``.
    cos, sin : torch.Tensor
        ``[L, r]`` with ``r <= d`` (partial rotary when ``r < d``).
    """
    rotary = cos.shape[-1]
    x_rot, x_pass = x[..., :rotary], x[..., rotary:]
    half = rotary // 2
    rotated = torch.cat([-x_rot[..., half:], x_rot[..., :half]], dim=-1)
    return torch.cat([x_rot * cos + rotated * sin, x_pass], dim=-1)


@dataclass(frozen=True)
class AttentionGeometry:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads


class ModelAdapter(ABC):
    """Base adapter for decoder-only causal LMs with ``model.model.layers``.

    Subclasses implement the per-family projections; the layer loop, norms, RoPE and head are shared.
    """

    #: transformers ``model_type`` values this adapter serves
    model_types: tuple[str, ...] = ()

    def __init__(self, model: nn.Module):
        self.model = model
        self.config = model.config
        self.layers = model.model.layers
        self.layer_kinds = tuple(self._layer_kind(layer) for layer in self.layers)
        # a kind names the layer's mixers, joined by "+" where they run side by side on the same input (Falcon-H1)
        self.attention_layers = tuple(i for i, kind in enumerate(self.layer_kinds) if "attention" in kind.split("+"))
        self.gdn_layers = tuple(i for i, kind in enumerate(self.layer_kinds) if kind == "gdn")
        attn = self.layers[self.attention_layers[0]].self_attn
        head_dim = attn.head_dim
        cos, _ = self.rope(torch.zeros(1, dtype=self.dtype), torch.zeros(1, dtype=torch.long))
        self.geometry = AttentionGeometry(
            num_heads=self.config.num_attention_heads,
            num_kv_heads=self.config.num_key_value_heads,
            head_dim=head_dim,
            rotary_dim=cos.shape[-1],
        )

    gated: bool = False

    @staticmethod
    def _layer_kind(layer: nn.Module) -> str:
        return "gdn" if hasattr(layer, "linear_attn") else "attention"

    @property
    def dtype(self) -> torch.dtype:
        return self.model.model.embed_tokens.weight.dtype

    @property
    def model_dir(self) -> Path | None:
        """The local directory the model was loaded from (where its calibration and estimator live), if any."""
        directory = getattr(self.config, "_name_or_path", "") or ""
        return Path(directory) if directory and Path(directory).is_dir() else None

    @property
    def device(self) -> torch.device:
        return self.model.model.embed_tokens.weight.device

    # ---- shared pieces of the layer loop -------------------------------------------------------------
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """``[L]`` token ids -> ``[1, L, D]`` embeddings."""
        return self.model.model.embed_tokens(ids.view(1, -1))

    def rope(self, like: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[L]`` positions -> ``(cos, sin)`` each ``[L, r]`` in ``like``'s dtype."""
        cos, sin = self.model.model.rotary_emb(like, positions.view(1, -1))
        return cos[0], sin[0]

    def mlp(self, layer_idx: int, hidden: torch.Tensor) -> torch.Tensor:
        layer = self.layers[layer_idx]
        out = layer.mlp(layer.post_attention_layernorm(hidden))
        return out[0] if isinstance(out, tuple) else out

    def input_norm(self, layer_idx: int, hidden: torch.Tensor) -> torch.Tensor:
        return self.layers[layer_idx].input_layernorm(hidden)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[1, L, D]`` last hidden states -> ``[L, V]`` logits."""
        return self.model.lm_head(self.model.model.norm(hidden))[0]

    # ---- attention ------------------------------------------------------------------------------------
    def attention_module(self, layer_idx: int) -> nn.Module:
        return self.layers[layer_idx].self_attn

    def attention_input(self, layer_idx: int, hidden: torch.Tensor) -> torch.Tensor:
        """What the attention projections read, from the layer's normed input ``[1, L, D]``: the same tensor, or
        (Falcon-H1) a scaled copy. The observers record this, so presses recompute queries from what attention saw."""
        return hidden

    @abstractmethod
    def project_query(self, layer_idx: int, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Pre-RoPE, post-norm queries ``[H, L, d]`` and the gate logits ``[L, H, d]`` (``None`` if ungated)."""

    def project_kv(self, layer_idx: int, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-RoPE, post-norm keys and values, each ``[H_kv, L, d]``."""
        module = self.attention_module(layer_idx)
        shape = (hidden.shape[1], -1, self.geometry.head_dim)
        keys = module.k_proj(hidden[0]).view(shape)
        if getattr(module, "k_norm", None) is not None:
            keys = module.k_norm(keys)
        values = module.v_proj(hidden[0]).view(shape)
        return keys.transpose(0, 1), values.transpose(0, 1)

    def queries(self, layer_idx: int, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Post-norm, post-RoPE queries ``[H, L, d]`` of the tokens whose layer input is ``hidden`` ``[1, L, D]``."""
        query, _ = self.project_query(layer_idx, hidden)
        return apply_rope(query, cos, sin)

    def output(self, layer_idx: int, attn: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        """``[L, H, d]`` attention output (and gate logits) -> ``[1, L, D]`` layer output."""
        if gate is not None:
            attn = attn * torch.sigmoid(gate)
        return self.attention_module(layer_idx).o_proj(attn.reshape(1, attn.shape[0], -1))

    # ---- GDN --------------------------------------------------------------------------------------------
    def gdn_module(self, layer_idx: int) -> nn.Module:
        return self.layers[layer_idx].linear_attn

    def gdn_projections(self, layer_idx: int, hidden: torch.Tensor):
        """Pre-conv ``mixed_qkv [1, C, L]``, gate ``z [1, L, Hv, dv]``, ``b`` and ``a`` ``[1, L, Hv]``."""
        raise TypeError(f"{type(self).__name__} has no GDN layers")

    def gdn_value_heads(self) -> int:
        return self.gdn_module(self.gdn_layers[0]).num_v_heads if self.gdn_layers else 0

    # ---- recurrent signals (GateSight) ------------------------------------------------------------------
    @property
    def signal_layers(self) -> tuple[int, ...]:
        """The recurrent layers whose per-token, per-head signal triples prefill records on request
        (``EvidenceRequest.recurrent_signals``): the GDN layers; a Mamba2 hybrid's adapter names its Mamba2 layers."""
        return self.gdn_layers

    def signal_heads(self) -> int:
        """Heads per signal layer (the second axis of a recorded ``[n, heads, 3]`` triple)."""
        return self.gdn_value_heads()

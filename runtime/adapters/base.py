"""What the runtime and the presses need to know about a model, behind one small interface.

An adapter is also the one place that states a family's facts: the model types it serves, which of its layers are
attention, GDN or Mamba2 (read from the config alone), whether the vLLM engine serves it and its tiny random test
models. A new architecture family is one adapter file plus its line in :data:`runtime.adapters.ADAPTERS`. Other places
read module internals by attribute: the GDN and Mamba2 continuation kernels (``runtime/gdn.py``,
``runtime/mamba2.py``: ``A_log``, ``dt_bias``, the conv, the mixer's sizes), the static half-lives
(``hybridmodel/half_lives.py``: ``A_log``, ``dt_bias``) and the utility labels' output projection
(``gatesight_learning/labels.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..errors import UsageError


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


def layers_with(kinds: Sequence[str], mixer: str) -> tuple[int, ...]:
    """Indices of the layers whose kind includes ``mixer`` (``"attention"``, ``"gdn"`` or ``"mamba2"``): a kind names
    the layer's mixers, joined by ``"+"`` where they run side by side on the same input (Falcon-H1)."""
    return tuple(i for i, kind in enumerate(kinds) if mixer in kind.split("+"))


class ModelAdapter(ABC):
    """Base adapter for decoder-only causal LMs with ``model.model.layers``; every layer attention unless a family
    says otherwise (:meth:`layer_kinds_from`).

    Subclasses implement the per-family projections; the layer loop, norms, RoPE and head are shared.
    """

    #: transformers ``model_type`` values this adapter serves
    model_types: tuple[str, ...] = ()
    #: whether the vLLM engine (:mod:`serving`) serves these model types (tests/serving/test_serving_vllm.py runs it)
    served_by_engine: bool = False
    #: whether the attention output is gated (:meth:`project_query` returns gate logits)
    gated: bool = False

    def __init__(self, model: nn.Module):
        self.model = model
        self.config = model.config
        self.layers = model.model.layers
        self.layer_kinds = self.layer_kinds_from(self.config)
        if len(self.layer_kinds) != len(self.layers):
            raise UsageError(f"{type(model).__name__} has {len(self.layers)} layers, but its config describes "
                             f"{len(self.layer_kinds)}: load the model as its config.json says")
        self.attention_layers = layers_with(self.layer_kinds, "attention")
        self.gdn_layers = layers_with(self.layer_kinds, "gdn")
        self.mamba2_layers = layers_with(self.layer_kinds, "mamba2")
        # the layers that carry a recurrent state, of either kind
        self.recurrent_layers = tuple(sorted(self.gdn_layers + self.mamba2_layers))
        if not self.attention_layers:
            raise UsageError(f"{type(model).__name__} has no attention layer (layer kinds: "
                             f"{', '.join(sorted(set(self.layer_kinds)))}): it has no KV cache to compress")
        attn = self.layers[self.attention_layers[0]].self_attn
        head_dim = attn.head_dim
        cos, _ = self.rope(torch.zeros(1, dtype=self.dtype, device=self.device),
                          torch.zeros(1, dtype=torch.long, device=self.device))
        self.geometry = AttentionGeometry(
            num_heads=self.config.num_attention_heads,
            num_kv_heads=self.config.num_key_value_heads,
            head_dim=head_dim,
            rotary_dim=cos.shape[-1],
        )

    # ---- the family's facts, read before any weight is loaded ---------------------------------------------
    @classmethod
    def layer_kinds_from(cls, config) -> tuple[str, ...]:
        """Each layer's kind, from the model's (text) config alone: ``"attention"``, ``"gdn"``, ``"mamba2"``, or
        ``"mamba2+attention"`` (both mixers side by side). The base reads a dense decoder: every layer attention.

        Parameters
        ----------
        config : transformers.PretrainedConfig
            The language model's config (a multimodal checkpoint's ``get_text_config()``).
        """
        return ("attention",) * config.num_hidden_layers

    @classmethod
    def tiny_configs(cls) -> dict[str, tuple[type, dict]]:
        """The family's tiny random test models (built by :mod:`testing.tiny_models`): ``{name: (config class,
        settings)}``; names are unique across the adapters, and each model is served by this adapter."""
        return {}

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
        """The layers whose per-token, per-head signal triples prefill records on request
        (``EvidenceRequest.recurrent_signals``): every recurrent layer, GDN or Mamba2."""
        return self.recurrent_layers

    def signal_heads(self) -> int:
        """Heads per signal layer (the second axis of a recorded ``[n, heads, 3]`` triple)."""
        return self.gdn_value_heads()

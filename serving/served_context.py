"""A held context in vLLM as the presses read it (:class:`ServedContext`): the attributes of a runtime ``Parent`` that
scoring reads (the adapter, the KV per layer as ``[H_kv, n, d]``, n, the protected prefix, the evidence recorded at
its prefill, the passes run after it), read from vLLM's pages by the compaction worker (:mod:`serving.worker`). The
adapter is the project's own, built on a meta-device twin of the served model's configuration (no weights), with a
real rotary embedding for re-rotating keys (:func:`twin_adapter`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from runtime import Evidence, LayerKV
from runtime.adapters import ModelAdapter, adapter_for


class ServedContext:
    """What presses read of a ``runtime.Parent``, over one held context's paged cache in vLLM.

    Attributes
    ----------
    adapter : ModelAdapter-like
    kv : dict[int, LayerKV]
        Dense ``[H_kv, n, d]`` keys and values per attention layer (post-RoPE, original positions).
    n, protected : int
    evidence : Evidence
        GDN signals as the runtime records them; ``window_hidden`` holds, per attention layer, vLLM's own queries
        ``[w, H * d]`` of the last ``w`` context tokens (the adapter's ``queries`` returns them as they are: the
        twin has no weights to project layer inputs with).
    context_ids : torch.Tensor
        ``[n]`` the context's ids.
    passes : Passes
        The passes after the context (:meth:`observe`), run by the engine as requests attached to the held context.
    """

    def __init__(self, adapter, kv: dict[int, LayerKV], n: int, protected: int, evidence: Evidence,
                 context_ids: torch.Tensor, passes: "Passes", tokenizer_source):
        self.adapter, self.kv, self.n, self.protected, self.evidence = adapter, kv, n, protected, evidence
        self.context_ids, self.passes, self._tokenizer_source = context_ids, passes, tokenizer_source

    @property
    def tokenizer(self):
        return self._tokenizer_source()

    def observe(self, ids, observer, context_hash: str | None = None) -> None:
        """Run ``ids`` after the context, showing ``observer`` every attention layer's queries and keys of those
        tokens (KVzip's reconstruction pass). The engine ran the pass (:class:`Passes`)."""
        self.passes.run(ids, observer)


class Passes:
    """The passes a press runs after the context, in two rounds: asked for (``recorded=None``: :meth:`run` notes
    the ids), then replayed from what vLLM's attention layers saw while the engine ran each one as a request attached
    to the held context (:class:`serving.signals.PassRecorder`). The replay refuses ids the engine did not run."""

    def __init__(self, recorded: list[tuple[list[int], dict]] | None = None):
        self.asked: list[list[int]] = []
        self._recorded = None if recorded is None else list(recorded)

    def run(self, ids, observer) -> None:
        ids = [int(i) for i in ids]
        if self._recorded is None:
            self.asked.append(ids)
            return
        if not self._recorded or self._recorded[0][0] != ids:
            raise RuntimeError("the press asked for a pass after the context the engine did not run (its passes "
                               "must not depend on their own outputs)")
        _, attention = self._recorded.pop(0)
        if observer is not None:
            for layer, (query, keys) in sorted(attention.items()):
                observer.on_attention(layer, None, query, None, keys, None, None)


class ServedAdapter:
    """The project's adapter of the meta twin, answering ``device`` and ``model_dir`` for the served model, and
    ``queries`` with the recorded ones."""

    def __init__(self, adapter: ModelAdapter, device: torch.device, model_dir: Path | None):
        self._adapter, self.device, self.model_dir = adapter, device, model_dir

    def __getattr__(self, name):
        return getattr(self._adapter, name)

    def queries(self, layer_idx: int, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``[H, L, d]``: the recorded post-RoPE queries ``hidden`` ``[1, L, H * d]`` (already rotated: ``cos``
        and ``sin`` are not applied again)."""
        return hidden[0].view(hidden.shape[1], -1, self._adapter.geometry.head_dim).transpose(0, 1)


def twin_adapter(hf_config, device: torch.device, model_dir: Path | None) -> ServedAdapter:
    from transformers import AutoModelForCausalLM

    config = hf_config.get_text_config()
    with torch.device("meta"):
        twin = AutoModelForCausalLM.from_config(config)
    # the rotary embedding is the one module computed for real: re-rotation needs its cos/sin
    twin.model.rotary_emb = type(twin.model.rotary_emb)(config=config).to(device)
    return ServedAdapter(adapter_for(twin), device, model_dir)

"""kvpress press objects as this project's (press, allocator, kept fraction).

A ``ScorerPress`` is scored through the bridge (:class:`~presses.kvpress_adapter.KvpressScorer`) and its
``compression_ratio`` sets the budget. The kvpress wrappers whose effect is a budget rule become that allocator:

- ``AdaKVPress(press, alpha_safeguard)`` -> ``adakv`` with ``safeguard = alpha_safeguard`` (kvpress floors each
  head at max(1, ⌊α·k⌋), the allocator at ⌊α·k⌋: they differ only where α·k < 1);
- ``PerLayerCompressionPress(press, compression_ratios)`` -> ``perlayer`` with weights 1 − r_ℓ over the attention
  layers and kept fraction their mean. kvpress keeps ⌊n·(1 − r_ℓ)⌋ in layer ℓ; ``perlayer`` splits exactly
  B = L_attn · H_kv · round(p·n) in proportion to the weights (largest remainder): the counts are equal wherever
  every n·(1 − r_ℓ) is an integer, and otherwise a layer may keep one entry more than kvpress's floor. kvpress
  indexes the ratios by layer, GDN layers included: give one per layer; those of GDN layers (no KV cache) are unused;
- ``PyramidKVPress`` -> its own scores (SnapKV's) with ``pyramid`` (β = its ``beta``): the same schedule,
  k_max = 2k − k/β down to k/β in depth, over the attention layers. kvpress falls back to a flat budget where
  k/β < ``window_size`` and rounds each layer on its own; ``pyramid`` keeps the schedule at every length (at
  least 4 per layer) and its counts sum to B exactly.

Every other kvpress press is refused with the reason: :data:`REFUSALS`, or, for a class it does not list, that
only per-entry scores carry over.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from allocators import AdaKVAllocator, Allocator, FlatAllocator, PerLayerAllocator, PyramidAllocator

from .kvpress_adapter import KvpressScorer

_ONE_PREFILL = "here the context is prefilled once, scored once, and compacted once before any question"
REFUSALS = {
    "DecodingPress": "it compresses during decoding; " + _ONE_PREFILL,
    "PrefillDecodingPress": "it adds decoding compression to a prefill press; pass its prefilling_press instead",
    "BlockPress": "it compresses block by block as if the context streamed in, each block's keep set depending on "
                  "the ratio; " + _ONE_PREFILL,
    "ChunkPress": "it keeps the ratio within every fixed-size chunk of the context, a budget rule no allocator "
                  "here has",
    "ChunkKVPress": "it keeps or drops whole chunks, so its keep set is not a top-k of per-entry scores",
    "ComposedPress": "it chains presses, each on the previous one's output; " + _ONE_PREFILL,
    "CriticalAdaKVPress": "its scores depend on the compression ratio (a budget-dependent two-stage selection): here "
                          "budgets come from the allocator after scoring",
    "DMSPress": "it evicts entries whose scores fall below a threshold: the kept counts follow the scores, not a "
                "budget an allocator sets",
    "DuoAttentionPress": "it turns heads into streaming heads (sink + recent tokens) from per-model patterns it "
                         "downloads, or calibrates on a downloaded data set: not a per-entry score, and this "
                         "project runs offline",
    "FinchPress": "it scores the context with the question (the tokens after its delimiter): the presses here never "
                  "see the question",
    "KeyRerotationPress": "it re-rotates the kept keys to contiguous positions; here kept keys keep their original "
                          "RoPE phase and the next position is n",
    "KVComposePress": "it sets its own budgets across layers and aligns kept positions across heads (composite "
                      "tokens): an allocation of its own, not a per-entry score",
    "KVzipPress": "it reconstructs the context through transformers' attention layers with kvpress's hooks, which "
                  "cannot run GDN layers; press='kvzip' is KVzip on this runtime (any model it supports)",
    "FastKVzipPress": "it downloads per-model trained gates from the Hugging Face hub (Jang-Hyun/Fast-KVzip)",
    "RestoreKVPress": "it downloads a LoRA adapter and restore embeddings from the Hugging Face hub",
    "LUKVPress": "its per-layer, per-head budgets are budget curves downloaded for specific models",
    "MergingPress": "it folds evicted values into the kept ones; the child here keeps its entries as they were",
    "SimLayerKVPress": "it decides per layer by an attention threshold whether to keep everything or only the first "
                       "and last entries: not a budget an allocator sets",
    "ThinKPress": "it prunes key channels (head dimensions), not entries; the child here keeps every kept entry "
                  "whole",
}
"""Why each kvpress press that is neither a ``ScorerPress`` nor a translated wrapper cannot run here (looked up
along the class's bases, so ``CAMPress`` gives ``DecodingPress``'s reason)."""


@dataclass(frozen=True)
class Translation:
    """A kvpress press as this project runs it.

    Attributes
    ----------
    press : KvpressScorer
        The kvpress scorer that ranks the entries.
    allocator : Allocator
        The wrapper's budget rule, or the default for a plain scorer (``flat``; ``pyramid`` for PyramidKVPress).
    keep_fraction : float
        1 − the press's ``compression_ratio`` (for ``PerLayerCompressionPress`` the mean over attention layers).
    wrapper : str or None
        The kvpress wrapper that set ``allocator`` (another allocator would contradict it); None for a scorer.
    """

    press: KvpressScorer
    allocator: Allocator
    keep_fraction: float
    wrapper: str | None = None


def is_kvpress_press(value) -> bool:
    """Whether ``value`` is a kvpress press (a ``BasePress`` instance; kvpress is not imported to find out)."""
    kvpress = sys.modules.get("kvpress")
    return kvpress is not None and isinstance(value, kvpress.BasePress)


def refusal(press) -> str:
    """Why the kvpress ``press`` (not a scorer, not a translated wrapper) cannot run here."""
    name = type(press).__name__
    for cls in type(press).__mro__:
        if cls.__name__ in REFUSALS:
            return f"kvpress {name} cannot run here: {REFUSALS[cls.__name__]}"
    return (f"kvpress {name} cannot run here: it is not a ScorerPress, and only per-entry scores (any ScorerPress) "
            "and the budget rules of AdaKVPress, PerLayerCompressionPress and PyramidKVPress carry over to this "
            "runtime, which compacts the cache itself after the prefill")


def translate(press, adapter) -> Translation:
    """``press`` (a kvpress press) for the model of ``adapter``; ``ValueError`` with the reason where it cannot run."""
    import kvpress

    name = type(press).__name__
    if isinstance(press, kvpress.AdaKVPress):
        inner = translate(press.press, adapter)
        return Translation(inner.press, AdaKVAllocator(safeguard=press.alpha_safeguard), inner.keep_fraction, name)
    if isinstance(press, kvpress.PerLayerCompressionPress):
        ratios, layers = list(press.compression_ratios), len(adapter.layer_kinds)
        if len(ratios) != layers:
            raise ValueError(f"{name} has {len(ratios)} compression ratios; {type(adapter.model).__name__} has "
                             f"{layers} layers: give one per layer, as kvpress indexes them (those of GDN layers "
                             "are unused: they hold no KV cache)")
        kept = [1.0 - ratios[layer] for layer in adapter.attention_layers]
        inner = translate(press.press, adapter)
        return Translation(inner.press, PerLayerAllocator(weights=kept), sum(kept) / len(kept), name)
    if isinstance(press, kvpress.ScorerPress):
        scorer = KvpressScorer(press=press)  # the bridge's refusals (downloads, ratio-dependent scores) come here
        default = PyramidAllocator(beta=press.beta) if isinstance(press, kvpress.PyramidKVPress) else FlatAllocator()
        return Translation(scorer, default, 1.0 - press.compression_ratio)
    raise ValueError(refusal(press))

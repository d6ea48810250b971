"""kvpress's short press names (``knorm``, ``snapkv``, ``adakv_snapkv``, ...) as the kvpress objects they name.

kvpress ships no name registry in its package; its evaluation (``evaluation/evaluate_registry.py``,
``PRESS_REGISTRY``) names the presses its configs and leaderboard use. :data:`NAMES` is that table (``no_press``
left out: ``press=None`` says it), each entry built only when asked for, so that naming one press never constructs
the others. What each object then does here (a scorer, a wrapper mapped onto an allocator, or a refusal with its
reason) is :mod:`presses.kvpress_wrappers`' business, not this table's.
"""

from __future__ import annotations

NAMES = {
    "adakv_compactor": lambda kv: kv.AdaKVPress(kv.CompactorPress()),
    "adakv_snapkv": lambda kv: kv.AdaKVPress(kv.SnapKVPress()),
    "block_keydiff": lambda kv: kv.BlockPress(press=kv.KeyDiffPress(), block_size=128),
    "cam_adakv_snapkv": lambda kv: kv.CAMPress(base_press=kv.AdaKVPress(kv.SnapKVPress())),
    "cam_knorm": lambda kv: kv.CAMPress(base_press=kv.KnormPress()),
    "cam_streaming_llm": lambda kv: kv.CAMPress(base_press=kv.StreamingLLMPress()),
    "cam_tova": lambda kv: kv.CAMPress(base_press=kv.TOVAPress()),
    "chunkkv": lambda kv: kv.ChunkKVPress(press=kv.SnapKVPress(), chunk_length=20),
    "compactor": lambda kv: kv.CompactorPress(),
    "critical_adakv_expected_attention": lambda kv: kv.CriticalAdaKVPress(kv.ExpectedAttentionPress(use_vnorm=False)),
    "critical_adakv_snapkv": lambda kv: kv.CriticalAdaKVPress(kv.SnapKVPress()),
    "critical_expected_attention": lambda kv: kv.CriticalKVPress(kv.ExpectedAttentionPress(use_vnorm=False)),
    "critical_snapkv": lambda kv: kv.CriticalKVPress(kv.SnapKVPress()),
    "cur": lambda kv: kv.CURPress(),
    "decoding_adakv_expected_attention_e2": lambda kv: kv.DecodingPress(
        base_press=kv.AdaKVPress(kv.ExpectedAttentionPress(epsilon=1e-2))),
    "decoding_adakv_snapkv": lambda kv: kv.DecodingPress(base_press=kv.AdaKVPress(kv.SnapKVPress())),
    "decoding_keydiff": lambda kv: kv.DecodingPress(base_press=kv.KeyDiffPress()),
    "decoding_knorm": lambda kv: kv.DecodingPress(base_press=kv.KnormPress()),
    "decoding_qfilter": lambda kv: kv.DecodingPress(base_press=kv.QFilterPress()),
    "decoding_streaming_llm": lambda kv: kv.DecodingPress(base_press=kv.StreamingLLMPress()),
    "decoding_tova": lambda kv: kv.DecodingPress(base_press=kv.TOVAPress()),
    "duo_attention": lambda kv: kv.DuoAttentionPress(),
    "duo_attention_on_the_fly": lambda kv: kv.DuoAttentionPress(on_the_fly_scoring=True),
    "expected_attention": lambda kv: kv.AdaKVPress(kv.ExpectedAttentionPress(epsilon=1e-2)),
    "fastkvzip": lambda kv: kv.FastKVzipPress(),
    "finch": lambda kv: kv.FinchPress(),
    "keydiff": lambda kv: kv.KeyDiffPress(),
    "knorm": lambda kv: kv.KnormPress(),
    "kvcompose": lambda kv: kv.KVComposePress(),
    "kvcompose_unstructured": lambda kv: kv.KVComposePress(structured=False),
    "kvzap_linear": lambda kv: kv.DMSPress(press=kv.KVzapPress(model_type="linear")),
    "kvzap_mlp": lambda kv: kv.DMSPress(press=kv.KVzapPress(model_type="mlp")),
    "kvzap_mlp_head": lambda kv: kv.KVzapPress(model_type="mlp"),
    "kvzap_mlp_layer": lambda kv: kv.AdaKVPress(kv.KVzapPress(model_type="mlp")),
    "kvzip": lambda kv: kv.KVzipPress(),
    "kvzip_plus": lambda kv: kv.KVzipPress(kvzip_plus_normalization=True),
    "lagkv": lambda kv: kv.LagKVPress(),
    "lukv": lambda kv: kv.LUKVPress(kv.ExpectedAttentionPress(epsilon=2e-2), sink=4, window=1),
    "merging_expected_attention": lambda kv: kv.MergingPress(kv.ExpectedAttentionPress(epsilon=1e-2)),
    "merging_knorm": lambda kv: kv.MergingPress(kv.KnormPress()),
    "merging_kvzap_mlp": lambda kv: kv.MergingPress(kv.KVzapPress(model_type="mlp")),
    "merging_snapkv": lambda kv: kv.MergingPress(kv.SnapKVPress()),
    "observed_attention": lambda kv: kv.ObservedAttentionPress(),
    "pyramidkv": lambda kv: kv.PyramidKVPress(),
    "qfilter": lambda kv: kv.QFilterPress(),
    "random": lambda kv: kv.RandomPress(),
    "RestoreKV": lambda kv: kv.RestoreKVPress(),
    "RestoreKV_plus": lambda kv: kv.RestoreKVPress(kvzip_plus_normalization=True),
    "snap_think": lambda kv: kv.ComposedPress([kv.SnapKVPress(), kv.ThinKPress()]),
    "snapkv": lambda kv: kv.SnapKVPress(),
    "streaming_llm": lambda kv: kv.StreamingLLMPress(),
    "think": lambda kv: kv.ThinKPress(),
    "tova": lambda kv: kv.TOVAPress(),
}
"""kvpress's ``PRESS_REGISTRY`` (evaluation/evaluate_registry.py, kvpress 0.5.x): name -> the press it builds."""


def kvpress_object(name: str):
    """The kvpress press the short name ``name`` of :data:`NAMES` builds (``KeyError`` if it names none)."""
    import kvpress

    return NAMES[name](kvpress)


def class_alias(name: str) -> str | None:
    """The kvpress class of which the short name ``name`` is another name: ``KnormPress`` for ``knorm``, whose
    press is ``KnormPress()``, the class built with its defaults (the two then name one setting); None for a name
    that builds anything else (a wrapper, a press with other fields) or that :data:`NAMES` lacks."""
    if name not in NAMES:
        return None
    press = kvpress_object(name)
    try:
        default = type(press)()
    except TypeError:  # a wrapper (CriticalKVPress(press)): no default build to be
        return None
    return type(press).__name__ if press == default else None

"""What the vLLM engine runs: presses, allocators, models, dtypes, parallelism. Checked before anything starts.

This module imports no vLLM, so the bench (and a user) can ask before building an engine, in any environment. What
runs in the engine is each press and allocator class's own word (``runs_in_engine``), read from the registries
(:func:`presses.register`, :func:`allocators.register`), and each model family's (its adapter's
``served_by_engine``). :func:`check_request` is the one call for a whole run;
:func:`check_model` and :func:`check_engine_args` are the parts :class:`serving.CompactingLLM` checks itself before
vLLM starts.
"""

from __future__ import annotations

import json
from pathlib import Path

from runtime.adapters import ADAPTERS
from runtime.bounded_read import METADATA_LIMIT, read_text_bounded
from runtime.errors import UsageError


def engine_presses() -> list[str]:
    """Registry names of the presses that run in the engine (``runs_in_engine``): they read the cache (and
    TriAttention its calibration), the GDN signals of vLLM's own forward (GateSight), the queries of the context's
    last tokens at vLLM's attention layers (SnapKV), or the queries of reconstruction passes run as requests attached
    to the held context (KVzip)."""
    import presses

    return [name for name, cls in presses.PRESSES.items() if cls.runs_in_engine]


def engine_allocators() -> list[str]:
    """Registry names of the allocators that run in the engine (``runs_in_engine``): each attention layer is its own
    KV-cache group, so layers keep different counts; the heads of one layer keep the same count."""
    import allocators

    return [name for name, cls in allocators.ALLOCATORS.items() if cls.runs_in_engine]


_PER_HEAD = ("vLLM's paged attention kernels take one sequence length per request and layer for all of its KV "
             "heads, so heads of one layer cannot keep different counts exactly")
_REFUSED_ALLOCATORS = {
    "adakv": f"it gives the heads of a layer different counts; {_PER_HEAD}",
    "global": f"its top-B over (layer, head, entry) gives the heads of a layer different counts; {_PER_HEAD}",
}
_KVPRESS = ("kvpress presses do not run in the engine: the serving environment has no kvpress (vLLM's CPU build "
            "brings transformers 5.19, which kvpress 0.5.5 refuses)")

SERVED_MODEL_TYPES = tuple(model_type for adapter in ADAPTERS if adapter.served_by_engine
                           for model_type in adapter.model_types)
"""Model types the engine serves, as each family's adapter says (``served_by_engine``; tested:
tests/serving/test_serving_vllm.py): Qwen3.5 and Qwen3.5-MoE both as the language model alone (``qwen3_5_text``: the
shipped default model) and as the hub lays them out, vision tower included (served text-only), and Qwen3-Next. GDN
layers vLLM's CPU kernels reject (head dims other than 64 and 128, dtypes other than bfloat16) run the plugin's
pure-torch path (:mod:`serving.gdn_torch`)."""
ENGINE_DTYPES = ("bfloat16", "float32")
"""What the engine computes and caches in (both tested)."""


def check_request(press_names, allocator_names, jobs: int, dtype: str, model_dir) -> None:
    """Refuse, before any work, a run the engine cannot do; ``ValueError`` naming the value and what is allowed.

    Parameters
    ----------
    press_names : sequence of str
        Registry names of the presses to score with (the no-pruning baseline is not a press: leave it out).
    allocator_names : sequence of str
    jobs : int
        Worker processes; the engine runs in this one.
    dtype : str
        What the engine computes and stores the cache in (``bfloat16``, ``float32``, ...).
    model_dir : str or Path
        The model directory (its ``config.json`` is read).
    """
    for name in press_names:
        check_press(name)
    for name in allocator_names:
        check_allocator(name)
    if jobs != 1:
        raise UsageError(f"jobs={jobs}: the vLLM engine runs in one process (use 1)")
    check_model(model_dir, dtype)


def check_press(name: str) -> None:
    if name.startswith("kvpress:"):
        raise UsageError(f"press {name!r}: {_KVPRESS}")
    served = engine_presses()
    if name not in served:
        raise UsageError(f"press {name!r} does not run in the engine; presses there: {', '.join(served)}")


def check_allocator(name: str) -> None:
    served = engine_allocators()
    if name not in served:
        reason = _REFUSED_ALLOCATORS.get(name)
        raise UsageError(f"allocator {name!r} does not run in the engine{': ' + reason if reason else ''}; "
                         f"allocators there: {', '.join(served)}")


def check_model(model_dir, dtype: str) -> None:
    """Refuse a model (or a dtype for it) that vLLM's CPU build cannot run, with the reason."""
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise UsageError(f"model {str(model_dir)!r}: the engine serves a local model directory with a config.json")
    config = _config(path)
    model_type = config.get("model_type")
    if model_type not in SERVED_MODEL_TYPES:
        raise UsageError(f"model {str(model_dir)!r} ({model_type}) does not run in the vLLM engine; the engine serves "
                         f"model types {', '.join(SERVED_MODEL_TYPES)}")
    if dtype not in ENGINE_DTYPES:
        raise UsageError(f"dtype {dtype!r}: the engine runs {', '.join(ENGINE_DTYPES)}")


def has_experts(model_dir) -> bool:
    """Whether the model's MLPs are mixtures of experts (``num_experts`` > 0 in its text config)."""
    config = _config(model_dir)
    return (config.get("text_config") or config).get("num_experts", 0) > 0


def is_multimodal(model_dir) -> bool:
    """Whether the checkpoint carries a vision tower (its config has a ``vision_config``)."""
    return (Path(model_dir) / "config.json").is_file() and "vision_config" in _config(model_dir)


def _config(model_dir) -> dict:
    """The model's ``config.json``, read within its bound (a 20 GB file is refused, not read whole)."""
    return json.loads(read_text_bounded(Path(model_dir) / "config.json", METADATA_LIMIT,
                                        "give the model's own config.json"))


def check_engine_args(engine_args: dict) -> None:
    """Refuse parallel engines (the plugin compacts on one worker; how plans would shard: docs/serving.md) and
    speculative decoding (a draft's tokens would write past a held context's kept entries, and the plugin's GDN path
    keeps one state per sequence)."""
    if engine_args.get("speculative_config") is not None:
        raise UsageError("speculative_config: the engine does not run speculative decoding with compaction")
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        size = engine_args.get(name, 1)
        if size != 1:
            raise UsageError(f"{name}={size}: the engine compacts on one worker process; parallel engines are not "
                             "supported (docs/serving.md says how plans would shard by KV head)")

"""Drive a vLLM engine through the fork protocol: prefill a context, score and compact its KV cache once, decode.

>>> engine = CompactingLLM("path/to/model", press="gatesight")
>>> result = engine.generate(context_ids, keep_fraction=0.1, max_tokens=32)
>>> result.tokens, result.freed_blocks

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that the driver reaches the scheduler
between steps; the worker is reached through ``collective_rpc``. Contexts are prefilled one at a time (the GDN
signal recorder attributes every prefill token of a step to the one context in flight).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from allocators import check_keep_fraction

ENGINE_DEFAULTS = dict(enable_prefix_caching=False, enforce_eager=True, dtype="bfloat16")


@dataclass
class CompactedGeneration:
    """Greedy tokens after a compacted context, and what compaction did.

    Attributes
    ----------
    tokens : list[int]
        The first comes from the full context's logits (as ``Parent.last_logits``), the rest from the compacted
        cache.
    n, kept : int
        Context tokens, and entries kept per attention layer and KV head.
    freed_blocks : int
        Attention blocks returned to the pool.
    free_blocks_before, free_blocks_after : int
        The pool's free-block count right before and after compaction.
    prefill_seconds, score_seconds, compact_seconds : float
    plan : dict
        ``{layer: [[kept body positions of head h]]}``.
    """

    tokens: list[int]
    n: int
    kept: int
    freed_blocks: int
    free_blocks_before: int
    free_blocks_after: int
    prefill_seconds: float
    score_seconds: float
    compact_seconds: float
    plan: dict = field(repr=False)


class CompactingLLM:
    """A ``vllm.LLM`` with the compaction worker extension and scheduler.

    Parameters
    ----------
    model : str
        What ``vllm.LLM`` takes; GateSight and TriAttention read their artifacts from it when it is a directory.
    press : str
        ``keydiff``, ``gatesight`` or ``triattention`` (presses that need the context's queries or a second pass,
        SnapKV and KVzip, do not run in the engine yet).
    press_options : dict, optional
    **engine_args
        Passed to ``vllm.LLM`` over :data:`ENGINE_DEFAULTS`.
    """

    def __init__(self, model: str, press: str = "keydiff", press_options: dict | None = None, **engine_args):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM

        t0 = time.perf_counter()
        self.llm = LLM(model=model, worker_extension_cls="serving.worker.CompactionWorker",
                       scheduler_cls="serving.scheduler.CompactingScheduler",
                       **{**ENGINE_DEFAULTS, **engine_args})
        self.layout = self.use_press(press, press_options)
        self.start_seconds = time.perf_counter() - t0
        self._requests = 0

    def use_press(self, press: str, options: dict | None = None) -> dict:
        """Score with ``press`` from the next context on; returns the page geometry (block size, attention
        layers). A press the engine cannot run is refused here with the reason."""
        return self.llm.collective_rpc("hybridpress_setup", args=(press, options))[0]

    @property
    def scheduler(self):
        return self.llm.llm_engine.engine_core.engine_core.scheduler

    @property
    def free_blocks(self) -> int:
        """Free blocks in the pool now."""
        return self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    def generate(self, context_ids: list[int], keep_fraction: float, max_tokens: int, protected: int = 0,
                 allocator: str = "flat", keep_positions: dict | None = None) -> CompactedGeneration:
        """Prefill ``context_ids``, compact its cache to ``keep_fraction`` of the body, decode greedily.

        ``keep_positions`` (``{layer: [[positions]]}``) replaces scoring with a given uniform plan.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if allocator != "flat":
            raise ValueError(f"allocator={allocator!r}: the engine compacts equal counts per layer and head ('flat') "
                             "until each attention layer gets its own KV-cache group")
        check_keep_fraction(keep_fraction, "keep_fraction")
        if max_tokens < 2:
            raise ValueError(f"max_tokens={max_tokens}: at least 2 (the first token comes before compaction)")
        if not 0 <= protected < len(context_ids):
            raise ValueError(f"protected={protected} must be in [0, {len(context_ids)}) for this context")
        if self.scheduler.requests:
            raise RuntimeError("another request is in flight: contexts are prefilled and compacted one at a time")
        engine = self.llm.llm_engine
        self._requests += 1
        request_id = f"context-{self._requests}"
        self.llm.collective_rpc("hybridpress_record")
        engine.add_request(request_id, TokensPrompt(prompt_token_ids=list(context_ids)),
                           SamplingParams(temperature=0.0, max_tokens=max_tokens, detokenize=False))
        (internal_id,) = self.scheduler.requests  # vLLM may add a suffix to the id
        t0 = time.perf_counter()
        while self.scheduler.requests[internal_id].num_output_tokens == 0:
            engine.step()
        prefill_seconds = time.perf_counter() - t0
        before = self.free_blocks
        t0 = time.perf_counter()
        try:
            report = self.llm.collective_rpc("hybridpress_compact",
                                             args=(internal_id, len(context_ids), keep_fraction, protected, allocator,
                                                   keep_positions))[0]
        except BaseException:
            engine.abort_request([request_id])  # nothing was written to the cache: the request just ends
            raise
        freed = self.scheduler.compact(internal_id, report["k"])
        compact_seconds = time.perf_counter() - t0
        after = self.free_blocks
        tokens: list[int] = []
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    tokens = list(output.outputs[0].token_ids)
        return CompactedGeneration(tokens, len(context_ids), report["k"], freed, before, after, prefill_seconds,
                                   report["score_seconds"], compact_seconds, report["plan"])

    def generate_plain(self, context_ids: list[int], max_tokens: int) -> list[int]:
        """Greedy tokens without compaction (the reference of keep-all)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        out = self.llm.generate([TokensPrompt(prompt_token_ids=list(context_ids))],
                                SamplingParams(temperature=0.0, max_tokens=max_tokens, detokenize=False),
                                use_tqdm=False)
        return list(out[0].outputs[0].token_ids)

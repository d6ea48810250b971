"""Drive a vLLM engine through the fork protocol: prefill a context once, compact its KV cache once, answer questions.

>>> engine = CompactingLLM("path/to/model", press="gatesight")
>>> context = engine.prefill(context_ids, keep_fraction=0.1)     # scored, compacted, held in the pool
>>> engine.answer(context, question_ids, max_tokens=32, context_hash=expected_sha256)
>>> engine.release(context)

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that the driver reaches the scheduler
between steps (its requests: :class:`serving.engine_requests.EngineRequests`); the worker is reached through
:class:`serving.worker_client.WorkerClient` (typed calls over ``collective_rpc``). Several contexts may prefill together
(:meth:`CompactingLLM.hold_many`: the evidence recorders split each step's tokens by request); any number stay
held, and questions on them run together (:meth:`CompactingLLM.answer_many`). A prefilled context is held
uncompacted first: the passes a press runs after the context (KVzip's reconstruction prompts) are requests attached
to it, like questions, while the worker records what vLLM's attention layers see; then it, or a copy of it, is
compacted in place. Every layer is its own KV-cache group (built so by
:func:`serving.vllm_internals.driver.per_layer_kv_cache_groups`), so attention layers keep their own counts
(:func:`serving.rules.engine_allocators`).
"""

from __future__ import annotations

import dataclasses
import os
import time

import torch

import presses
import runtime
from allocators import check_keep_fraction

from .engine_requests import EngineRequests
from .held_context import HeldContext
from .rules import check_engine_args, check_model, check_press, has_experts, is_multimodal
from .worker_client import Geometry, LayerPages, WorkerClient

# max_logprobs=-1: the fidelity measures need the full next-token distributions
ENGINE_DEFAULTS = dict(enable_prefix_caching=False, enforce_eager=True, max_logprobs=-1)


class CompactingLLM:
    """A ``vllm.LLM`` with the compaction worker extension and scheduler.

    Parameters
    ----------
    model : str
        The model directory; GateSight reads its estimator from it, TriAttention and ``gate`` its calibration.
    press : str
        One of :func:`serving.rules.engine_presses`: the press :meth:`prefill`, :meth:`hold` and :meth:`compact` use
        when not given one (:meth:`use_press` changes it).
    press_options : dict, optional
    dtype : str
        What the engine computes and caches in; a dtype vLLM's CPU build cannot run the model in is refused
        (:func:`serving.rules.check_model`), as are parallel engines, before vLLM starts.
    **engine_args
        Passed to ``vllm.LLM`` over :data:`ENGINE_DEFAULTS`.
    """

    def __init__(self, model: str, press: str = "keydiff", press_options: dict | None = None,
                 dtype: str = "bfloat16", **engine_args):
        check_engine_args(engine_args)
        check_model(model, dtype)
        check_press(press)
        presses.get(press, **(press_options or {}))  # its options, checked before vLLM starts
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        from vllm import LLM

        from . import gdn_torch
        from .vllm_internals import driver, gdn, registry

        self._vi = driver
        t0 = time.perf_counter()
        if has_experts(model) and driver.parallel_groups_lack_experts():
            raise RuntimeError(f"{model} has experts, and an earlier engine in this process (a model without "
                               "experts) built vLLM's process-wide parallel groups without the expert-parallel one: "
                               "build this engine in a fresh process, or before the other")
        registry.register_qwen3_5_without_torchvision()
        if is_multimodal(model):  # a checkpoint with its vision tower: the engine serves its language model
            engine_args.setdefault("limit_mm_per_prompt", {"image": 0, "video": 0})
        with driver.per_layer_kv_cache_groups(), gdn.torch_gdn_where_kernels_refuse(gdn_torch.forward):
            self.llm = LLM(model=model, worker_extension_cls="serving.worker.CompactionWorker",
                           scheduler_cls="serving.scheduler.CompactingScheduler", dtype=dtype,
                           **{**ENGINE_DEFAULTS, **engine_args})
        self.worker = WorkerClient(self.llm)
        self.geometry: Geometry = self.worker.setup()
        self._requests = EngineRequests(self.llm, self.worker, self.geometry)
        self.use_press(press, press_options)
        self.start_seconds = time.perf_counter() - t0
        self.contexts: dict[str, HeldContext] = {}

    def use_press(self, press: str, options: dict | None = None) -> None:
        """Make ``press`` (built with ``options``) the engine's press: the one :meth:`prefill`, :meth:`hold` and
        :meth:`compact` use when not given one. A press the engine cannot run is refused here with the reason."""
        check_press(press)
        self.worker.prepare_press(press, options)
        self.press, self.press_options = press, options

    @property
    def layout(self) -> dict:
        """:attr:`geometry` as a dict, for callers written against it (``benchmarks/serving_cost.py``)."""
        return dataclasses.asdict(self.geometry)

    def _chosen(self, press: str | None, options: dict | None) -> tuple[str, dict | None]:
        """``(press, options)`` to score with: the given press, or the engine's press with its options."""
        if press is None:
            if options is not None:
                raise ValueError(f"press options {sorted(options)} without a press: name the press they are for")
            return self.press, self.press_options
        check_press(press)
        return press, options

    @property
    def scheduler(self):
        return self._requests.scheduler

    @property
    def free_blocks(self) -> int:
        """Free blocks in the pool now (a block holds one layer's page)."""
        return self._requests.free_blocks

    def prefill(self, context_ids: list[int], keep_fraction: float, protected: int = 0,
                allocator: str = "flat", allocator_options: dict | None = None, *, press: str | None = None,
                press_options: dict | None = None) -> HeldContext:
        """Prefill ``context_ids``, score it with ``press`` (built with ``press_options``; default the engine's
        press), compact its cache to ``keep_fraction`` of the body with ``allocator`` (one of
        :func:`serving.rules.engine_allocators`, built with ``allocator_options``), and hold it: :meth:`hold`, then
        :meth:`compact` in place."""
        press, press_options = self._chosen(press, press_options)
        check_keep_fraction(keep_fraction, "keep_fraction")
        self.worker.check_allocator(allocator, allocator_options)
        held = self.hold(context_ids, protected, [press], press_options)
        return self.compact(held, keep_fraction, allocator, allocator_options, copy=False, press=press,
                            press_options=press_options)

    def hold(self, context_ids: list[int], protected: int = 0, presses: list[str] | None = None,
             press_options: dict | None = None) -> HeldContext:
        """Prefill ``context_ids`` and hold it uncompacted, with the evidence that every press of ``presses``
        (built with ``press_options``; default the engine's press) reads: a parent that :meth:`compact` compacts
        copies of, one per method, with one prefill."""
        return self.hold_many([context_ids], protected, presses, press_options)[0]

    def hold_many(self, contexts: list[list[int]], protected: int | list[int] = 0, presses: list[str] | None = None,
                  press_options: dict | None = None) -> list[HeldContext]:
        """:meth:`hold` for several contexts prefilled together (vLLM batches their prefill tokens; the evidence is
        split by request), each held as soon as its prefill ends. ``protected``: one for all, or one per context."""
        if not len(contexts):
            raise ValueError("no contexts to hold")
        names = ["the context"] if len(contexts) == 1 else [f"context {i}" for i in range(len(contexts))]
        contexts = [self._requests.token_ids(ids, name) for ids, name in zip(contexts, names)]
        prefixes = protected if isinstance(protected, (list, tuple)) else [protected] * len(contexts)
        if len(prefixes) != len(contexts):
            raise ValueError(f"{len(prefixes)} protected prefixes for {len(contexts)} contexts")
        for ids, prefix, name in zip(contexts, prefixes, names):
            if isinstance(prefix, bool) or not isinstance(prefix, int) or not 0 <= prefix < len(ids):
                raise ValueError(f"protected={prefix!r} must be an integer in [0, {len(ids)}) for {name}")
        if presses is None:
            name, press_options = self._chosen(None, press_options)
            presses = [name]
        for name in presses:
            check_press(name)
        self._requests.check_idle()
        engine = self.llm.llm_engine
        # two tokens so that a request is still running, its blocks allocated, after its prefill step
        pending, order = {}, []
        held: dict[str, HeldContext] = {}
        t0 = time.perf_counter()
        try:
            for ids, prefix in zip(contexts, prefixes):
                request_id, external_id = self._requests.add(ids, max_tokens=2)
                pending[request_id] = (external_id, ids, prefix)
                order.append(request_id)
            self.worker.start_recording(presses, press_options)
            while pending:
                progress = {rid: self._vi.computed_tokens(self.scheduler, rid) for rid in pending}
                engine.step()
                for request_id, (external_id, ids, prefix) in list(pending.items()):
                    if self._vi.output_tokens(self.scheduler, request_id) == 0:
                        continue
                    # held before the next step, which would decode it
                    self.worker.prefilled(request_id, len(ids))
                    blocks = self.scheduler.hold(request_id)
                    engine.abort_request([external_id])  # its blocks stay, held; its one generated token is dropped
                    del pending[request_id]
                    held[request_id] = HeldContext(
                        handle=request_id, context_hash=runtime.context_hash(torch.as_tensor(ids)), n=len(ids),
                        protected=prefix, computed=len(ids),
                        kept={layer: len(ids) for layer in self.geometry.attention_groups},
                        prefill_seconds=time.perf_counter() - t0, blocks=blocks, context_ids=ids)
                    self.contexts[request_id] = held[request_id]
                now = {rid: self._vi.computed_tokens(self.scheduler, rid) for rid in pending}
                if any(now[rid] < progress[rid] for rid in now):
                    raise RuntimeError("vLLM preempted a context while it prefilled (the pool ran short): hold fewer "
                                       "at once, or build the engine with a larger pool")
                if now and len(now) == len(progress) and all(now[rid] == progress[rid] for rid in now):
                    raise RuntimeError(f"the pool has {self.free_blocks} free blocks, too few to prefill "
                                       f"{len(pending)} more context(s) of {max(len(v[1]) for v in pending.values())} "
                                       "tokens at most: release held contexts, hold fewer at once, or build the "
                                       "engine with a larger pool")
        except BaseException:
            engine.abort_request([external_id for external_id, _, _ in pending.values()])
            for context in held.values():
                self.release(context)
            raise
        finally:
            self.worker.stop_recording()
        return [held[request_id] for request_id in order]

    def compact(self, context: HeldContext, keep_fraction: float, allocator: str = "flat",
                allocator_options: dict | None = None, copy: bool = True, *, press: str | None = None,
                press_options: dict | None = None) -> HeldContext:
        """Score the uncompacted held ``context`` with ``press`` (built with ``press_options``; default the engine's
        press) and compact it to ``keep_fraction`` of the body with ``allocator``: a copy of it (the context stays
        held as it was), or with ``copy=False`` the context itself. The passes a press runs after the context
        (KVzip) are requests attached to it."""
        press, press_options = self._chosen(press, press_options)
        check_keep_fraction(keep_fraction, "keep_fraction")
        self.worker.check_allocator(allocator, allocator_options)
        self._check_held(context)
        if context.compacted:
            raise ValueError(f"context {context.handle} is compacted already: compact a context held whole "
                             "(CompactingLLM.hold)")
        self._requests.check_idle()
        n, groups = context.n, self.geometry.attention_groups
        t0 = time.perf_counter()
        target = self._copy(context) if copy else context
        try:
            before = self.free_blocks
            blocks = self._requests.block_ids(target)
            passes = self.worker.passes(context.handle, context.context_ids, blocks, context.protected, press,
                                        press_options)
            limit = self._vi.max_model_len(self.llm)
            if passes and n + max(map(len, passes)) > limit:
                raise ValueError(f"the press's passes after the context read up to {n + max(map(len, passes))} "
                                 f"tokens (the {n}-token context and a {max(map(len, passes))}-token pass); the "
                                 f"engine's max_model_len is {limit}: build it with a larger one, or give the press "
                                 "a smaller chunk_size")
            t1 = time.perf_counter()
            for pass_ids in passes:
                self.worker.record_pass(context.handle, pass_ids)
                self._attached([(context, pass_ids, None)], max_tokens=1)
                self.worker.pass_recorded(context.handle)
            pass_seconds = time.perf_counter() - t1
            report = self.worker.compact(context.handle, context.context_ids, blocks, keep_fraction,
                                         context.protected, allocator, allocator_options, press, press_options)
            freed = self.scheduler.shrink(target.blocks, {groups[layer]: k for layer, k in report.kept.items()})
        except BaseException:
            self.release(target)
            raise
        compacted = dataclasses.replace(
            target, computed=report.computed, kept=report.kept,
            freed_blocks={layer: freed[g] for layer, g in groups.items()}, free_blocks_before=before,
            free_blocks_after=self.free_blocks, score_seconds=pass_seconds + report.score_seconds,
            compact_seconds=time.perf_counter() - t0, plan=report.plan)
        self.contexts[compacted.handle] = compacted
        return compacted

    def _copy(self, context: HeldContext) -> HeldContext:
        """A second held copy of ``context`` (its pages and GDN states in blocks of their own)."""
        request_id, blocks = self._requests.hold_copy(context)
        copy = HeldContext(handle=request_id, context_hash=context.context_hash, n=context.n,
                           protected=context.protected, computed=context.computed, kept=dict(context.kept),
                           prefill_seconds=context.prefill_seconds, blocks=blocks, context_ids=context.context_ids)
        self.contexts[copy.handle] = copy
        return copy

    def answer(self, context: HeldContext, question_ids: list[int], max_tokens: int,
               stop_token_ids: list[int] | None = None, context_hash: str | None = None) -> list[int]:
        """Greedy tokens after ``question_ids``, continuing from a copy of the held context (its GDN states and
        compacted KV); the held context is unchanged, so every question starts from the same state.

        ``context_hash``, when given, must be the held context's SHA-256 (a question asked of another context is
        refused). Decoding stops after ``max_tokens`` or after a token of ``stop_token_ids`` (which is returned).
        """
        return self.answer_many([(context, question_ids)], max_tokens, stop_token_ids,
                                [context_hash] if context_hash is not None else None)[0]

    def answer_many(self, questions: list[tuple[HeldContext, list[int]]], max_tokens: int,
                    stop_token_ids: list[int] | None = None, context_hashes: list[str] | None = None
                    ) -> list[list[int]]:
        """:meth:`answer` for several ``(held context, question ids)`` at once, all in flight together (the engine
        batches them, up to its ``max_num_seqs``); a context may appear several times. Every question is checked
        before any is queued; ``context_hashes``, when given, one per question."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens} must be >= 1")
        if context_hashes is not None and len(context_hashes) != len(questions):
            raise ValueError(f"{len(context_hashes)} context hashes for {len(questions)} questions")
        outputs = self._attached([(held, ids, None if context_hashes is None else context_hashes[i])
                                  for i, (held, ids) in enumerate(questions)],
                                 max_tokens=max_tokens, stop_token_ids=stop_token_ids)
        return [list(output.token_ids) for output in outputs]

    def log_probs(self, context: HeldContext, ids: list[int]) -> torch.Tensor:
        """``[L, V]`` float32 log-probabilities of the next token after each of the ``L`` tokens ``ids`` read after
        the held context (teacher-forced; the runtime's ``CachedContext.logits`` up to a constant per row)."""
        (output,) = self._attached([(context, ids, None)], max_tokens=1, prompt_logprobs=-1, logprobs=-1)
        rows = [*output.prompt_logprobs[-(len(ids) - 1):], output.logprobs[0]] if len(ids) > 1 else [
            output.logprobs[0]]
        dense = torch.full((len(rows), self.vocab_size), float("-inf"))
        for i, row in enumerate(rows):
            dense[i, list(row)] = torch.tensor([entry.logprob for entry in row.values()])
        return dense

    @property
    def vocab_size(self) -> int:
        return self._requests.vocab_size

    def _attached(self, questions: list[tuple[HeldContext, list[int], str | None]], **sampling) -> list:
        """Run one request per ``(held context, ids, expected hash)``, each attached to its held context, all in
        flight together (:meth:`~serving.engine_requests.EngineRequests.run_attached`); their finished completion
        outputs, in order. Every context must be held by this engine and asked with its own hash, every ids token
        ids: all checked before a request is queued."""
        checked = []
        for held, ids, expected_hash in questions:
            self._check_held(held)
            if expected_hash is not None and expected_hash != held.context_hash:
                raise ValueError(f"context hash mismatch: the held context is {held.context_hash[:12]}…, the "
                                 f"question was asked of {expected_hash[:12]}…")
            checked.append((held, self._requests.token_ids(ids, "the question")))
        return self._requests.run_attached(checked, **sampling)

    def pages(self, context: HeldContext) -> dict[int, LayerPages]:
        """``{layer: (keys, values)}``, each ``[H_kv, kept[layer], d]``: the entries a held context's pages contain
        (keys rotated to the engine's positions)."""
        self._check_held(context)
        blocks = self._requests.block_ids(context)
        return self.worker.read({layer: blocks[group] for layer, group in self.geometry.attention_groups.items()},
                                context.kept)

    def release(self, context: HeldContext) -> None:
        """Return a held context's blocks to the pool."""
        if self.contexts.pop(context.handle, None) is None:
            raise ValueError(f"context {context.handle} is not held by this engine (released already?)")
        self.scheduler.release(context.blocks)
        self.worker.forget(context.handle)

    def generate_plain(self, prompt_ids: list[int], max_tokens: int) -> list[int]:
        """Greedy tokens of vLLM without the plugin (the reference of keep-all)."""
        self._requests.check_idle()
        _, external_id = self._requests.add(list(prompt_ids), max_tokens=max_tokens)
        return list(self._requests.run_to_end()[external_id].token_ids)

    # ---- helpers -------------------------------------------------------------------------------------
    def _check_held(self, context: HeldContext) -> None:
        if self.contexts.get(context.handle) is not context:
            raise ValueError(f"context {context.handle} is not held by this engine (released?)")


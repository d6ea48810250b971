"""The :class:`~bench.run.engine.Engine` of ``--engine vllm``: the protocol run inside vLLM (:mod:`serving`).

The full cache is the context held uncompacted, with the evidence of every press (one prefill); each compacted child
a copy of it, scored and compacted in the engine, answered alone; the references come from the engine too. vLLM
lives in its own environment (``scripts/serving_env.sh``): :mod:`serving` is imported only when this engine is built.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from runtime import Answer, KeepPlan

from .engine import Child, Compacted
from .fidelity import answer_log_probs
from .specs import PressSpec


class ServedEngine:
    """A :class:`serving.CompactingLLM` of the model directory, for contexts of up to ``length`` tokens.

    Parameters
    ----------
    model_dir : Path
    dtype : str
    length : int
        The run's ``--length``: the engine's ``max_model_len`` leaves room beyond it.
    tokenizer
    """

    def __init__(self, model_dir: Path, dtype: str, length: int, tokenizer):
        from serving import CompactingLLM

        # each child names its press in compact(); keydiff is only the engine's default. On CPU vLLM checks
        # gpu_memory_utilization of the machine's memory against what is free (the HF copy of the model the harness
        # holds takes some) and the KV pool gets kv_cache_memory_bytes: 1 GiB holds 80K tokens of the 0.8B geometry.
        # max_model_len leaves room for a question (512) and for KVzip's passes after the context (a 2,000-token
        # chunk and its prompt)
        self.llm = CompactingLLM(str(model_dir), press="keydiff", dtype=dtype, max_model_len=length + 2560,
                                 max_num_seqs=1, gpu_memory_utilization=0.3, kv_cache_memory_bytes=1 << 30)
        self.tokenizer = tokenizer

    def prefill(self, context_ids: torch.Tensor, protected: int, presses: list[PressSpec]) -> _ServedContext:
        from serving.cache import EngineCache

        # one option set for every press: bench.run.plan refuses a vLLM run whose presses differ in options
        options = presses[0].kwargs if presses else {}
        names = sorted({spec.name for spec in presses})
        held = self.llm.hold(context_ids.tolist(), protected, names, options)
        return _ServedContext(self, EngineCache(self.llm, held, self.tokenizer))


class _ServedContext:
    """A :class:`~bench.run.engine.HeldContext` held in the engine."""

    scored_by: tuple[str, ...] = ()  # each child is scored in the engine, as it is compacted

    def __init__(self, engine: ServedEngine, parent):
        self.engine, self.parent = engine, parent
        self.n, self.prefill_seconds = parent.n, parent.held.prefill_seconds
        self.kv_nbytes, self.recurrent_nbytes = parent.kv_nbytes, parent.recurrent_nbytes

    def check_kept(self) -> None:
        """Nothing is checked here: the context lives in the engine, where each child's press scores it
        (:mod:`serving.worker`), which this process cannot fingerprint."""

    def reference(self, prompt_ids, answer_ids, max_new_tokens: int, eos_token_id) -> tuple[Answer, torch.Tensor]:
        # a context held in an engine answers and scores in two requests
        answer = self.parent.answer(prompt_ids, max_new_tokens, eos_token_id)
        return answer, answer_log_probs(self.parent, prompt_ids, answer_ids)

    def groups(self, children: list[Child], questions: list) -> Iterator[_ServedChild]:
        from serving.cache import EngineCache

        for method, p in children:
            held = self.engine.llm.compact(self.parent.held, p, allocator=method.allocator.name,
                                           allocator_options=method.allocator.kwargs, press=method.press.name,
                                           press_options=method.press.kwargs)
            yield _ServedChild(self, (method, p), EngineCache(self.engine.llm, held, self.engine.tokenizer))

    def release(self) -> None:
        self.parent.release()


class _ServedChild:
    """One compacted copy held in the engine, answered alone; the scores stay in the engine (no rank)."""

    def __init__(self, context: _ServedContext, child: Child, cache):
        self.cache, self.eos = cache, context.engine.tokenizer.eos_token_id
        plan = KeepPlan({int(layer): heads for layer, heads in cache.held.plan.items()})
        self.members = [Compacted(child, plan, cache.kv_nbytes, cache.recurrent_nbytes, cache.held.score_seconds,
                                  lambda q: None)]

    def answer(self, question, which: list[int]) -> tuple[list[Answer], list[torch.Tensor]]:
        answers, log_probs = [], []
        for _ in which:  # one member
            answers.append(self.cache.answer(question.prompt_ids, question.question.max_new_tokens, self.eos))
            log_probs.append(answer_log_probs(self.cache, question.prompt_ids, question.reference.answer_ids))
        return answers, log_probs

    def release(self) -> None:
        self.cache.release()

"""The requests the engine driver (:class:`serving.engine.CompactingLLM`) runs on the in-process vLLM engine: queued
greedy with their token ids checked first, attached to a held context (the scheduler gives them blocks for its
entries, the worker copies its pages and GDN states in), and stepped to their end, a preempted one an error rather
than an answer recomputed from placeholders.
"""

from __future__ import annotations

import torch

from .held_context import HeldContext
from .worker_client import Geometry, WorkerClient

PLACEHOLDER = 0
"""The id of each context position in the prompt of a request attached to a held context: those tokens are never
computed (their cache entries are copied in), only counted."""


class EngineRequests:
    """The requests of one ``vllm.LLM`` built by :class:`serving.engine.CompactingLLM`, each queued under a front-end
    id of its own (``hybridpress-<n>``).

    Parameters
    ----------
    llm : vllm.LLM
        In-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): its scheduler is reached between steps.
    worker : WorkerClient
    geometry : Geometry
        The worker's pages (:meth:`WorkerClient.setup`).
    """

    def __init__(self, llm, worker: WorkerClient, geometry: Geometry):
        from .vllm_internals import driver  # vLLM's own: imported once an engine exists

        self.llm, self.worker, self.geometry, self._vi = llm, worker, geometry, driver
        self._count = 0

    @property
    def scheduler(self):
        return self._vi.engine_scheduler(self.llm)

    @property
    def free_blocks(self) -> int:
        """Free blocks in the pool now (a block holds one layer's page)."""
        return self._vi.num_free_blocks(self.scheduler)

    @property
    def vocab_size(self) -> int:
        return self._vi.vocab_size(self.llm)

    def token_ids(self, ids, what: str) -> list[int]:
        """``ids`` as a list of token ids; ``ValueError`` naming what is wrong (empty, not integers, outside the
        vocabulary) before anything is queued."""
        values = torch.as_tensor(ids)
        if values.numel() == 0:
            raise ValueError(f"{what} is empty: give at least one token id")
        if values.dim() != 1 or values.dtype.is_floating_point or values.dtype.is_complex or values.dtype == torch.bool:
            raise ValueError(f"{what}: expected a 1-D sequence of integer token ids, got {values.dtype} of shape "
                             f"{tuple(values.shape)}")
        outside = values[(values < 0) | (values >= self.vocab_size)]
        if outside.numel():
            raise ValueError(f"{what}: token id {int(outside[0])} is outside the vocabulary [0, {self.vocab_size})")
        return values.tolist()

    def block_ids(self, context: HeldContext) -> tuple[list[int], ...]:
        return self._vi.ids_of_blocks(context.blocks)

    def check_idle(self) -> None:
        if self._vi.request_ids(self.scheduler):
            raise RuntimeError("another request is in flight: the driver starts work when the engine is idle")

    def add(self, prompt_ids: list[int], **sampling) -> tuple[str, str]:
        """Queue a greedy request; its ids in the scheduler and in the engine's front end."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self._count += 1
        external_id = f"hybridpress-{self._count}"
        before = self._vi.request_ids(self.scheduler)
        self.llm.llm_engine.add_request(external_id, TokensPrompt(prompt_token_ids=prompt_ids),
                                        SamplingParams(temperature=0.0, detokenize=False, **sampling))
        (request_id,) = self._vi.request_ids(self.scheduler) - before  # the scheduler's id carries a suffix
        return request_id, external_id

    def attach(self, request_id: str, held: HeldContext) -> None:
        """Give the waiting request ``request_id`` blocks for ``held``'s entries, marked computed, and copy the held
        pages and GDN states into them (the scheduler's and the worker's halves of attaching)."""
        groups = self.geometry.attention_groups
        target = self.scheduler.attach(request_id, held.computed, {groups[layer]: k for layer, k in held.kept.items()})
        self.worker.attach(request_id, self.block_ids(held), target, held.computed, held.kept)

    def detach(self, request_id: str) -> None:
        self.scheduler.detach(request_id)
        self.worker.detach(request_id)

    def hold_copy(self, held: HeldContext) -> tuple[str, tuple]:
        """The blocks of a second copy of ``held`` (its pages and GDN states in blocks of their own), and the
        request's id that names it: a request attached to ``held``, whose blocks are held before it ever runs."""
        request_id, external_id = self.add([PLACEHOLDER] * (held.computed + 1), max_tokens=1)
        try:
            self.attach(request_id, held)
            blocks = self.scheduler.hold(request_id)
        finally:
            self.llm.llm_engine.abort_request([external_id])
            self.detach(request_id)
        return request_id, blocks

    def blocks_needed(self, held: HeldContext, tokens: int) -> int:
        """Blocks a request attached to ``held`` takes with ``tokens`` tokens of its own (question + generated):
        each attention layer its kept entries and the tokens, each recurrent group the held context's slots."""
        groups, block = self.geometry.attention_groups, self.geometry.block_size
        attention = sum(-(-(k + tokens) // block) for k in held.kept.values())
        return attention + sum(len(b) for g, b in enumerate(held.blocks) if g not in groups.values())

    def run_attached(self, checked: list[tuple[HeldContext, list[int]]], **sampling) -> list:
        """Run one request per ``(held context, token ids)``, each attached to its held context, all in flight
        together; their finished completion outputs, in order. The pool must hold every block they can take (their
        copies of the held contexts and all their tokens), so vLLM never preempts one: a preempted request would be
        recomputed from its placeholders."""
        self.check_idle()
        need = sum(self.blocks_needed(held, len(ids) + sampling["max_tokens"]) for held, ids in checked)
        if need > self.free_blocks:
            raise ValueError(f"{len(checked)} request(s) in flight together can take up to {need} blocks (copies of "
                             f"their held contexts and all their tokens); the pool has {self.free_blocks} free: "
                             "release held contexts, ask fewer at once, or build the engine with a larger pool")
        requests = []
        try:
            for held, ids in checked:
                request_id, external_id = self.add([PLACEHOLDER] * held.computed + ids, **sampling)
                requests.append((request_id, external_id, held.computed))
                self.attach(request_id, held)
            finished = self.run_to_end({request_id: computed for request_id, _, computed in requests})
        except BaseException:
            self.llm.llm_engine.abort_request([external_id for _, external_id, _ in requests])
            raise
        finally:
            for request_id, _, _ in requests:
                self.detach(request_id)
        return [finished[external_id] for _, external_id, _ in requests]

    def run_to_end(self, attached: dict[str, int] | None = None) -> dict:
        """Step until every request in flight finishes; their completion outputs (with the prompt's log-probs) by
        front-end id. ``attached``: the scheduler ids of requests attached to held contexts and their computed
        counts; one that vLLM preempts (its computed count reset) is an error, not an answer from placeholders."""
        finished = {}
        engine = self.llm.llm_engine
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    finished[output.request_id] = output.outputs[0]
                    finished[output.request_id].prompt_logprobs = output.prompt_logprobs
            for request_id, computed in (attached or {}).items():
                now = self._vi.computed_tokens(self.scheduler, request_id)
                if now is not None and now < computed:
                    raise RuntimeError(f"vLLM preempted request {request_id} (the pool ran out of blocks): it would "
                                       "be recomputed from its placeholders, not from the held context; release held "
                                       "contexts or ask fewer questions at once")
        return finished

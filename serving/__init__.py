"""The serving path: compaction inside vLLM (its own environment: see the README's "Serving with vLLM").

:class:`~serving.engine.CompactingLLM` drives the engine; :mod:`serving.worker` (``worker_extension_cls``) scores
and compacts on the worker with the project's presses and allocators, called through the typed client
:class:`~serving.worker_client.WorkerClient`; :mod:`serving.scheduler`
(``scheduler_cls``) shortens the request and returns the freed blocks to the pool; :mod:`serving.vllm_internals`
holds every private name of vLLM the plugin uses. Nothing of vLLM is edited. :func:`~serving.rules.check_request`
says, without vLLM, whether the engine can run a request.
"""

from .engine import CompactingLLM
from .held_context import HeldContext
from .rules import check_request, engine_allocators, engine_presses

__all__ = ["CompactingLLM", "HeldContext", "check_request", "engine_allocators", "engine_presses"]

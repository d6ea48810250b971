"""The serving path: compaction inside vLLM (its own environment: see the README's "Serving with vLLM").

:class:`~serving.engine.CompactingLLM` drives the engine; :mod:`serving.worker` (``worker_extension_cls``) scores
and compacts on the worker with the project's presses and allocators; :mod:`serving.scheduler`
(``scheduler_cls``) shortens the request and returns the freed blocks to the pool. Nothing of vLLM is edited.
"""

from .engine import ENGINE_PRESSES, CompactingLLM, HeldContext

__all__ = ["ENGINE_PRESSES", "CompactingLLM", "HeldContext"]

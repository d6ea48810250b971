"""Every registered press and allocator, built offline for a given model: the one table of build options tests,
benchmarks and scripts share (as kvpress's own ``tests/default_presses.py``).

A press that needs nothing beyond its defaults needs no entry: a new press is tested by every registry-driven
test as soon as it is in the registry. Entries name what a press would otherwise read from a trained model's
directory or from the hub.
"""

from __future__ import annotations

import torch

import allocators
import presses
from presses.calibration import calibrate
from presses.gatesight import GateSightEstimator
from runtime import adapter_for
from runtime.adapters.tiny import VOCAB


class ByteTokenizer:
    """A tokenizer for the tiny random models: bytes modulo their vocabulary."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [b % VOCAB for b in text.encode()]}


def _gatesight(model) -> dict:
    return {"estimator": GateSightEstimator.random(adapter_for(model))}  # a trained one lives in <model>/gatesight


def _kvzip(model) -> dict:
    return {"tokenizer": ByteTokenizer(), "chunk_size": 64}  # the reconstruction prompt needs a tokenizer


def _triattention(model) -> dict:
    ids = torch.randint(0, VOCAB, (64,), generator=torch.Generator().manual_seed(9)).to(model.device)
    return {"calibration": calibrate(model, [ids], ["random"])}  # else <model>/calibration


PRESS_OPTIONS = {"gatesight": _gatesight, "kvzip": _kvzip, "triattention": _triattention}
"""Registry name -> ``(model) -> options`` for presses that cannot be built from their defaults alone offline."""
REGISTERED_PRESSES = [name for name in presses.PRESSES if name != "kvpress"]
"""Every press of the registry by its own name (the kvpress bridge, one name per kvpress class, has its own tests)."""


def offline_press(name: str, model) -> presses.Press:
    """Press ``name`` of the registry, built for ``model`` without any file or download."""
    return presses.get(name, **PRESS_OPTIONS.get(name, lambda _: {})(model))


def offline_allocator(name: str, attention_layers: int) -> allocators.Allocator:
    """Allocator ``name`` with the options it cannot do without (perlayer: one weight per attention layer)."""
    options = {"perlayer": {"weights": [1.0 + 2 * k for k in range(attention_layers)]}}.get(name, {})
    return allocators.get(name, **options)

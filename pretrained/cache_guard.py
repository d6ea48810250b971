"""Where no command writes its results: the model cache, which only ``bench fetch-model`` fills, and the source
checkout's folder of shipped deltas. A library caller is held to it as the CLI is (:func:`check_outside_the_cache`
runs in :func:`bench.run.plan.plan` and :func:`bench.store.merge.merge_stores` too)."""

from __future__ import annotations

import os
from pathlib import Path

from artifacts.output_kinds import DISTILLED_DELTA, MODEL_CACHE, TRAINED_MODEL
from artifacts.outputs import Output

from .catalog import SHIPPED_DELTAS
from .model_cache import CACHE_ENV, cache_dir

IN_SHIPPED = (DISTILLED_DELTA, TRAINED_MODEL)
"""The outputs written inside the checkout's ``models/`` folder, beside a model's own artifacts (an estimator, a
calibration: outputs that name their model)."""


def check_outside_the_cache(outputs: list[Output]) -> None:
    """A :class:`~runtime.errors.UsageError` for an output that is the model cache's root (named by
    :data:`~pretrained.model_cache.CACHE_ENV`, else the default), its ``models/`` folder, or lies in that folder and
    is no model's (a model's artifacts, a model trained there), unless it is the cache itself (``bench
    fetch-model``): a result there sits among the models, and the cache, then holding another command's files, is
    refused to every fetch. The checkout's ``models/`` folder itself is refused alike (a delta is written into a
    folder of its own inside it), and inside it every output but a model, a delta (:data:`IN_SHIPPED`) and a model's
    own artifacts: a result or checkpoint there would be committed as part of the model."""
    models = Path(os.path.realpath(cache_dir()))
    shipped = Path(os.path.realpath(SHIPPED_DELTAS))
    for output in outputs:
        real = Path(os.path.realpath(output.path))
        if output.kind_of is not MODEL_CACHE and (real in (models, models.parent) or (
                models in real.parents and output.model is None)):
            where = f"{CACHE_ENV}={models.parent}" if os.environ.get(CACHE_ENV) else f"the default ({models.parent})"
            what = ("is the model cache's root" if real == models.parent else "is the model cache's models/ folder"
                    if real == models else "lies in the model cache's models/ folder")
            raise output.refuse(f"{what} ({where}), where converted models live; give a folder outside it")
        if real == shipped:
            raise output.refuse("is the source checkout's folder of shipped deltas (one folder a model); give a "
                                "folder outside it")
        if shipped in real.parents and output.kind_of not in IN_SHIPPED and output.model is None:
            raise output.refuse(f"lies in the source checkout's folder of shipped deltas ({shipped}), which holds "
                                "models, their deltas and their own artifacts only; give a folder outside it")

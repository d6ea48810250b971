"""What to keep: one file per scorer, a registry, and the shared selection."""

from .base import Press, Scores
from .pipeline import pipeline
from .selection import Selection, compress
from .gatesight import GateSightEstimator
from .registry import PRESSES, available, get, options_of

__all__ = ["GateSightEstimator", "PRESSES", "Press", "Scores", "Selection", "available", "compress", "get", "options_of",
           "pipeline"]

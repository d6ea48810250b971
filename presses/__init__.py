"""What to keep: one file per scorer, a registry, and the shared selection."""

from .base import BranchingContext, Press, Scores, ScoringContext
from .gatesight import GateSightEstimator
from .pipeline import pipeline
from .registry import PRESSES, available, get, options_of, register
from .selection import Selection, compress

__all__ = ["BranchingContext", "GateSightEstimator", "PRESSES", "Press", "Scores", "ScoringContext", "Selection",
           "available", "compress", "get", "options_of", "pipeline", "register"]

"""What to keep: one file per scorer, a registry, and the shared selection."""

from .base import BranchingContext, Press, Scores, ScoringContext
from .pipeline import pipeline
from .selection import Selection, compress
from .gatesight import GateSightEstimator
from .registry import PRESSES, available, get, options_of, register

__all__ = ["BranchingContext", "GateSightEstimator", "PRESSES", "Press", "Scores", "ScoringContext", "Selection",
           "available", "compress", "get", "options_of", "pipeline", "register"]

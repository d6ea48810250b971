"""Benchmark tasks: RULER generators (offline, seeded)."""

from .items import Item, Question
from .ruler import PROFILES, TASKS, Config, generate

__all__ = ["Config", "Item", "PROFILES", "Question", "TASKS", "generate"]

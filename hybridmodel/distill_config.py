"""The schedule of a distillation run (:mod:`hybridmodel.distill`), importable without torch: the ``bench`` CLI
reads its defaults for ``bench distill --help``."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class DistillConfig:
    """The run's schedule; a checkpoint of one config is never resumed under another.

    Attributes
    ----------
    transfer_steps, kd_steps : int
        Steps of each stage (one window of ``length`` tokens per step).
    length : int
        Tokens per window.
    transfer_lr, kd_lr : float
        Peak AdamW learning rates (cosine to 10 % of the peak after ``warmup`` steps, per stage).
    warmup : int
    seed : int
    eval_every : int
        Steps between held-out evaluations.
    eval_windows : int
        Held-out windows evaluated (``length`` tokens each).
    """

    transfer_steps: int = 300
    kd_steps: int = 1500
    length: int = 1024
    transfer_lr: float = 1e-3
    kd_lr: float = 2e-4
    warmup: int = 20
    seed: int = 0
    eval_every: int = 50
    eval_windows: int = 6

    def __post_init__(self):
        for name in ("transfer_steps", "kd_steps", "length", "warmup", "eval_every", "eval_windows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name != "warmup" else 0):
                raise ValueError(f"{name}={value!r}: expected a positive integer")

    @property
    def steps(self) -> int:
        return self.transfer_steps + self.kd_steps

    def stage(self, step: int) -> str:
        return "transfer" if step < self.transfer_steps else "kd"

    def learning_rate(self, step: int) -> float:
        first, count, peak = ((0, self.transfer_steps, self.transfer_lr) if self.stage(step) == "transfer"
                              else (self.transfer_steps, self.kd_steps, self.kd_lr))
        k = step - first
        if k < self.warmup:
            return peak * (k + 1) / self.warmup
        progress = (k - self.warmup) / max(1, count - self.warmup)
        return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

"""Paired bootstrap over items: intervals for every cell, task average and difference between methods.

The unit of resampling is the item (one context, named by its seed and index: item 0 of seed 1 is another context
than item 0 of seed 0): its questions are averaged first, so a task with several questions per context does not
count its contexts several times. Every method and kept fraction is evaluated on
the *same* resample of items, so differences between methods are paired and their intervals are much narrower
than the intervals of the two cells they come from.
"""

from __future__ import annotations

import math
import warnings
import zlib
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from ..store.row_fields import BASELINE, method_of


@dataclass(frozen=True)
class Interval:
    """A point estimate with a percentile interval.

    Attributes
    ----------
    mean : float
    low, high : float
        The interval's bounds (NaN when no resample has a value).
    """

    mean: float
    low: float
    high: float

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def format(self, scale: float = 1.0, digits: int = 1) -> str:
        mean, low, high = (shown(value * scale, digits) for value in (self.mean, self.low, self.high))
        return f"{mean} [{low}, {high}]"


def shown(value: float, digits: int) -> str:
    """``value`` with ``digits`` decimals, or "–" where it is no number (a cell without any item; a mean past the
    float range): a report never prints ``nan`` or ``inf``."""
    return f"{value:.{digits}f}" if math.isfinite(value) else "–"


def task_of(row: dict) -> str:
    """A row's task as reports name it: ``task`` on the generated haystack, ``task@source`` on a real one (the
    same generator on other text is another task)."""
    haystack = row.get("haystack", "generated")
    return row["task"] if haystack == "generated" else f"{row['task']}@{haystack}"


class PairedBootstrap:
    """Item-level values of one metric for every (method, p) cell of each task, resampled jointly.

    Parameters
    ----------
    rows : list[dict]
        Result rows of one setting group (one model, weights, profile, length and code version).
    field : str
        The per-question metric (``score``, ``delta_nll``, ``kl``, ``agree``).
    resamples : int
        Bootstrap resamples (≥ 1,000 for the published tables).
    seed : int
        The resample of task ``t`` depends on ``seed`` and ``t`` only, so tables are reproducible.
    """

    def __init__(self, rows: list[dict], field: str, resamples: int = 1000, seed: int = 0, level: float = 0.95):
        per_item: dict[tuple, dict[tuple, list[float]]] = defaultdict(lambda: defaultdict(list))
        for row in rows:
            if row.get(field) is not None:
                per_item[(task_of(row), method_of(row), float(row["keep_fraction"]))][
                    (row.get("seed", 0), row["item"])].append(float(row[field]))
        self.field, self.level = field, level
        self.tasks = sorted({task for task, _, _ in per_item})
        self.cells = sorted({(m, r) for _, m, r in per_item})
        self.items: dict[str, list[tuple]] = {}  # task -> its contexts, (seed, item)
        self.values: dict[str, np.ndarray] = {}  # task -> [cells, items], NaN where a cell lacks an item
        self.draws: dict[str, np.ndarray] = {}  # task -> [resamples, items] indices
        for task in self.tasks:
            items = sorted({i for (t, _, _), by_item in per_item.items() if t == task for i in by_item})
            matrix = np.full((len(self.cells), len(items)), np.nan)
            for c, (method, p) in enumerate(self.cells):
                by_item = per_item.get((task, method, p), {})
                for k, item in enumerate(items):
                    if item in by_item:
                        matrix[c, k] = np.mean(by_item[item])
            rng = np.random.default_rng([seed, zlib.crc32(task.encode())])
            self.items[task], self.values[task] = items, matrix
            self.draws[task] = rng.integers(0, len(items), size=(resamples, len(items)))
        self._index = {cell: c for c, cell in enumerate(self.cells)}

    def has_baseline(self) -> bool:
        return (BASELINE, 1.0) in self._index

    def n_items(self, task: str) -> int:
        return len(self.items[task])

    def has(self, method: str, p: float, task: str) -> bool:
        cell = self._cell(method, p)
        return cell in self._index and not np.isnan(self.values[task][self._index[cell]]).all()

    def _cell(self, method: str, p: float) -> tuple[str, float]:
        # the no-prune baseline is one cell (p = 1) that stands for every kept fraction
        return (BASELINE, 1.0) if method == BASELINE else (method, float(p))

    def _task_samples(self, method: str, p: float, task: str) -> tuple[float, np.ndarray]:
        """(mean over items, ``[resamples]`` means over resampled items) of one cell."""
        row = self.values[task][self._index[self._cell(method, p)]]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a cell without any item: NaN, shown as "–"
            return float(np.nanmean(row)), np.nanmean(row[self.draws[task]], axis=1)

    def _average_samples(self, method: str, p: float, tasks: list[str]) -> tuple[float, np.ndarray]:
        parts = [self._task_samples(method, p, t) for t in tasks]
        return float(np.mean([part[0] for part in parts])), np.mean([part[1] for part in parts], axis=0)

    def _interval(self, point: float, samples: np.ndarray) -> Interval:
        tail = (1 - self.level) / 2 * 100
        samples = samples[~np.isnan(samples)]
        low, high = np.percentile(samples, [tail, 100 - tail]) if samples.size else (np.nan, np.nan)
        return Interval(point, float(low), float(high))

    def cell(self, method: str, p: float, task: str) -> Interval:
        """Mean over the task's items, with its interval."""
        return self._interval(*self._task_samples(method, p, task))

    def average(self, method: str, p: float, tasks: list[str]) -> Interval:
        """Mean over ``tasks`` of the per-task means (each task weighs the same), with its interval."""
        return self._interval(*self._average_samples(method, p, tasks))

    def difference(self, a: str, p_a: float, b: str, p_b: float, tasks: list[str]) -> Interval:
        """Paired difference of task averages, ``a − b``, on the same resampled items."""
        point_a, samples_a = self._average_samples(a, p_a, tasks)
        point_b, samples_b = self._average_samples(b, p_b, tasks)
        return self._interval(point_a - point_b, samples_a - samples_b)

    def _over_fractions(self, method: str, keep_fractions: list[float], tasks: list[str]) -> tuple[float, np.ndarray]:
        parts = [self._average_samples(method, r, tasks) for r in keep_fractions]
        return float(np.mean([part[0] for part in parts])), np.mean([part[1] for part in parts], axis=0)

    def mean_over_fractions(self, method: str, keep_fractions: list[float], tasks: list[str]) -> Interval:
        """The task average, averaged again over kept fractions ``keep_fractions`` (the paper's "mean" column)."""
        return self._interval(*self._over_fractions(method, keep_fractions, tasks))

    def difference_over_fractions(self, a: str, b: str, keep_fractions: list[float], tasks: list[str]) -> Interval:
        """Paired ``a − b`` of :meth:`mean_over_fractions`, on the same resampled items."""
        point_a, samples_a = self._over_fractions(a, keep_fractions, tasks)
        point_b, samples_b = self._over_fractions(b, keep_fractions, tasks)
        return self._interval(point_a - point_b, samples_a - samples_b)

"""The oracle allocation of issue 66: GateSight's choice within each head under KVzip/global's own per-context head
counts — how much of GateSight's gap to KVzip/global is the budget across heads.

The press ``gatesight_oracle`` registered here scores a context with both GateSight and KVzip and hands each head
KVzip's scores of that head *re-ordered by GateSight's ranking*: the r-th best entry by GateSight gets the head's r-th
largest KVzip score. Every head then holds exactly KVzip's multiset of scores, so the ``global`` allocator's top-B
gives each (layer, head) the count it gives KVzip at every kept fraction (up to exact ties between heads), while
inside a head the top entries are GateSight's. Run it as ``gatesight_oracle/global`` through ``bench compare``
(every other flag is bench compare's own); rows name the press ``gatesight_oracle``.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/oracle_allocation.py --model smollm2-135m-hybrid \\
        --methods gatesight_oracle/global --keep-fractions 0.05,0.1,0.3,0.5 --tasks niah_single_2,niah_multikey_1 \\
        --haystack manpages --n 10 --length 2048 --out /work/g66-runs/oracle-2048

Study code outside the packages: the rows' code version does not hash this file (the press's code is here).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch

import presses
from presses.base import Press, Scores


def reorder_by(ranking: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``[H, n]``: per row, the values of ``values`` sorted descending, placed in the descending order of
    ``ranking`` (stable: the earlier position first on ties)."""
    order = torch.sort(-ranking.float(), dim=1, stable=True).indices
    ranked_values = torch.sort(values.float(), dim=1, descending=True).values
    return torch.empty_like(ranked_values).scatter_(1, order, ranked_values)


@dataclass
class GateSightOraclePress(Press):
    """GateSight's ranking within each head carrying KVzip's per-head scores (the module docstring)."""

    gatesight: Press = field(default_factory=lambda: presses.get("gatesight"))
    kvzip: Press = field(default_factory=lambda: presses.get("kvzip"))
    name = "gatesight_oracle"
    comparable_scale = True
    runs_after_context = True

    def evidence(self, adapter):
        return self.gatesight.evidence(adapter) | self.kvzip.evidence(adapter)

    def bind(self, model):
        self.gatesight.bind(model)
        self.kvzip.bind(model)

    def check(self, adapter):
        self.gatesight.check(adapter)
        self.kvzip.check(adapter)

    def score(self, context) -> Scores:
        ranking, values = self.gatesight.score(context), self.kvzip.score(context)
        return {layer: reorder_by(ranking[layer], values[layer]) for layer in ranking}


if __name__ == "__main__":
    from bench.commands.cli import main

    presses.register(GateSightOraclePress)
    sys.exit(main(["compare", *sys.argv[1:]]))

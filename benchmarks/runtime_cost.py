"""Prefill, fork and decode-step times of a p = 0.1 child against the full cache, and bytes, in one run.

    python benchmarks/runtime_cost.py [n ...]      (default: 4096 16384)
"""

import sys

import torch

from bench.cost import median_seconds
from runtime import KeepPlan, prefill
from testing.tiny_models import tiny_model


def main(lengths):
    model = tiny_model("qwen3_5", num_hidden_layers=8)
    print("| n | prefill s | fork (p=0.1) s | decode step full ms | decode step p=0.1 ms | ratio | "
          "child KV bytes / parent |")
    print("|---|---|---|---|---|---|---|")
    for n in lengths:
        context = torch.randint(0, 97, (n,), generator=torch.Generator().manual_seed(n))
        prefill_s = median_seconds(lambda: prefill(model, context).release(), repeats=3)
        parent = prefill(model, context)
        body = parent.n
        g = torch.Generator().manual_seed(0)
        plan = KeepPlan({layer: [torch.sort(torch.randperm(body, generator=g)[: body // 10]).values for _ in range(2)]
                         for layer in parent.adapter.attention_layers})
        fork_s = median_seconds(lambda: parent.fork(plan).release(), repeats=5)
        full, tenth = parent.fork(parent.keep_all_plan()), parent.fork(plan)
        token = torch.tensor([3])
        full_ms = 1000 * median_seconds(lambda: full.logits(token), repeats=20)
        tenth_ms = 1000 * median_seconds(lambda: tenth.logits(token), repeats=20)
        print(f"| {n} | {prefill_s:.3f} | {fork_s:.4f} | {full_ms:.2f} | {tenth_ms:.2f} | {tenth_ms / full_ms:.2f} | "
              f"{tenth.kv_nbytes} / {parent.kv_nbytes} = {tenth.kv_nbytes / parent.kv_nbytes:.3f} |", flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [4096, 16384])

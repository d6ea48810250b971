"""Runtime costs at the geometry of the models users run, with random weights (nothing is downloaded).

``python benchmarks/real_geometry.py --lengths 4096,8192,16384 [--family qwen3_5|qwen3_next] [--layers N]
[--device cpu|cuda] [--out docs/real_geometry.md]``

Per context length, each figure a ratio from one run: ``prefill`` against transformers' own forward of the same
tokens; peak RSS (or CUDA memory) over weights + KV + evidence; GateSight and KVzip scoring against prefill; the
decode step of a p = 0.1 child against the full cache.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import torch
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig, Qwen3NextConfig, Qwen3NextForCausalLM

import presses
from presses.gatesight import GateSightEstimator
from runtime import adapter_for, prefill

ROPE = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}


def build(family: str, layers: int) -> torch.nn.Module:
    """0.8B-like geometry: hidden 1024, every fourth layer full attention, 8 query / 2 KV heads × 256, GDN
    16 × 128 heads, vocabulary cut to 32K; ``qwen3_next`` adds small routed experts."""
    common = dict(vocab_size=32768, hidden_size=1024, num_hidden_layers=layers, num_attention_heads=8,
                  num_key_value_heads=2, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=16,
                  linear_key_head_dim=128, linear_value_head_dim=128, full_attention_interval=4,
                  max_position_embeddings=262144)
    if family == "qwen3_5":
        config = Qwen3_5TextConfig(**common, intermediate_size=3584,
                                   rope_parameters={**ROPE, "mrope_section": [11, 11, 10], "mrope_interleaved": True})
        return Qwen3_5ForCausalLM(config)
    config = Qwen3NextConfig(**common, intermediate_size=3584, moe_intermediate_size=256,
                             shared_expert_intermediate_size=512, num_experts=16, num_experts_per_tok=2,
                             rope_parameters=ROPE)
    return Qwen3NextForCausalLM(config)


class PeakMemory:
    """Peak memory while the ``with`` block runs, above what was held when it began, in bytes (CPU: resident set
    from /proc/self/statm sampled every 5 ms; CUDA: the allocator's peak)."""

    def __init__(self, device: torch.device):
        self.device, self.peak, self._running = device, 0, False

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _sample(self) -> None:
        while self._running:
            self.peak = max(self.peak, self._rss())
            time.sleep(0.005)

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.before = torch.cuda.memory_allocated(self.device)
        else:
            self._running, self.peak = True, self._rss()
            self.before = self.peak
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated(self.device)
        else:
            self._running = False
            self._thread.join()
            self.peak = max(self.peak, self._rss())
        self.peak -= self.before


def seconds(fn, device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", default="qwen3_5", choices=["qwen3_5", "qwen3_next"])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--lengths", default="4096,8192,16384")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--chunk", type=int, default=4096, help="prefill chunk size")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = build(args.family, args.layers).to(device, torch.bfloat16).eval()
    adapter = adapter_for(model)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    gatesight = presses.get("gatesight", estimator=GateSightEstimator.random(adapter))
    kvzip = presses.get("kvzip", tokenizer=_Bytes(), chunk_size=2000)
    evidence = gatesight.evidence(adapter) | kvzip.evidence(adapter)
    lines = [f"# Runtime at real geometry ({args.family}, {args.layers} layers, bfloat16, "
             f"random weights, {device})", "",
             f"`python benchmarks/real_geometry.py --family {args.family} --layers {args.layers} "
             f"--lengths {args.lengths} --device {args.device} --chunk {args.chunk}`; "
             f"weights {weights / 2**30:.2f} GiB.", "",
             "Memory: the peak during each prefill above what the process held before it (resident set on CPU, "
             "allocator on CUDA), against what the parent keeps afterwards (KV + GateSight's evidence); the "
             "difference is the transient overhead. transformers' forward keeps nothing (use_cache=False).", "",
             "| tokens | prefill s (× transformers) | prefill peak GiB: ours / transformers' / KV+evidence kept | "
             "evidence B/token | GateSight score / prefill | KVzip score / prefill | decode step p=0.1 / full |",
             "|---|---|---|---|---|---|---|"]
    for n in (int(x) for x in args.lengths.split(",")):
        ids = torch.randint(0, 32768, (n,), device=device)
        with torch.no_grad(), PeakMemory(device) as their_memory:
            theirs, _ = seconds(lambda: model(ids[None], use_cache=False), device)
        with PeakMemory(device) as our_memory:
            ours, parent = seconds(lambda: prefill(model, ids, protected=16, evidence=evidence, chunk_size=args.chunk),
                                   device)
        kv = parent.kv_nbytes
        held = sum(s.nbytes for s in parent.evidence.recurrent_signals.values())
        g_s, _ = seconds(lambda: presses.Selection(parent, gatesight).scores, device)
        z_s, _ = seconds(lambda: presses.Selection(parent, kvzip).scores, device)
        child = presses.Selection(parent, gatesight).fork("flat", 0.1)
        token = torch.tensor([1], device=device)
        full_s, _ = seconds(lambda: [parent.logits(token) for _ in range(5)], device)
        child_s, _ = seconds(lambda: [child.logits(token) for _ in range(5)], device)
        lines.append(f"| {n} | {ours:.1f} ({ours / theirs:.2f}×) | {our_memory.peak / 2**30:.2f} / "
                     f"{their_memory.peak / 2**30:.2f} / {(kv + held) / 2**30:.2f} | {held / n:.0f} | "
                     f"{g_s / ours:.2%} | {z_s / ours:.2f}× | "
                     f"{child_s / full_s:.2f} |")
        print(lines[-1], flush=True)
        parent.release()
        child.release()
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


class _Bytes:
    """KVzip's repeat prompt as byte ids (random weights: any ids below the vocabulary will do)."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": list(text.encode())}


if __name__ == "__main__":
    main()

"""Device checks and timings for ``scripts/gpu_check.sh`` (needs CUDA); writes Markdown to ``argv[1]``."""

import sys
import time
from pathlib import Path

import torch

import presses
from presses.gatesight import GateSightEstimator
from runtime import adapter_for, prefill
from testing.offline import REGISTERED_PRESSES, offline_press
from testing.tiny_models import MODELS

report, lines = Path(sys.argv[1]), []


def record(*rows: str) -> None:
    """Append ``rows`` to the report, printed and written at once: a run cut short keeps what it measured."""
    lines.extend(rows)
    print(*rows, sep="\n", flush=True)
    report.write_text("\n".join(lines) + "\n")


record("# GPU check", "", f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", "")


def seconds(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, result


# 1. invariants on the GPU: keep-all fork = transformers' forward; every press scores and compacts
record("## Invariants on cuda", "",
       "| family | dtype | max abs logit diff, keep-all child vs forward | greedy equal |",
       "|---|---|---|---|")
for family, build in MODELS.items():
    for dtype in (torch.float32, torch.bfloat16):
        model = build().to("cuda", dtype)
        ids = torch.randint(0, 97, (300,), device="cuda")
        question = torch.randint(0, 97, (8,), device="cuda")
        child = prefill(model, ids, protected=4).fork(prefill(model, ids, protected=4).keep_all_plan())
        ours = child.logits(question).float()
        with torch.no_grad():
            fresh = model(torch.cat([ids, question])[None]).logits[0, 300:].float()
        record(f"| {family} | {dtype} | {(ours - fresh).abs().max().item():.2e} | "
               f"{bool((ours.argmax(-1) == fresh.argmax(-1)).all())} |")
model = MODELS["qwen3_5"]().to("cuda")
adapter = adapter_for(model)
record("", "| press | scores on | child bytes at p = 0.1 |", "|---|---|---|")
for name in REGISTERED_PRESSES:
    press = offline_press(name, model)
    parent = prefill(model, torch.randint(0, 97, (500,), device="cuda"), protected=4, evidence=press.evidence(adapter))
    selection = presses.Selection(parent, press)
    device = next(iter(selection.scores.values())).device
    record(f"| {name} | {device} | {selection.fork('flat', 0.1).kv_nbytes} |")

# 2. timings at real geometry (random weights): prefill, GateSight scoring, decode step of a p = 0.1 child
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig  # noqa: E402

config = Qwen3_5TextConfig(
    vocab_size=32768, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24, num_attention_heads=8,
    num_key_value_heads=2, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128,
    linear_value_head_dim=128, full_attention_interval=4, max_position_embeddings=262144,
    rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                     "mrope_section": [11, 11, 10], "mrope_interleaved": True},
)
big = Qwen3_5ForCausalLM(config).to("cuda", torch.bfloat16).eval()
adapter = adapter_for(big)
press = presses.get("gatesight", estimator=GateSightEstimator.random(adapter))
record("", "## 0.8B geometry, random weights, bfloat16", "",
       "| tokens | prefill s | GateSight scoring s (× prefill) | decode step full / p = 0.1 (ms) | peak GiB |",
       "|---|---|---|---|---|")
for n in (16384, 65536):
    torch.cuda.reset_peak_memory_stats()
    ids = torch.randint(0, 32768, (n,), device="cuda")
    prefill_s, parent = seconds(lambda: prefill(big, ids, protected=16, evidence=press.evidence(adapter),
                                                chunk_size=8192))
    selection = presses.Selection(parent, press)
    score_s, _ = seconds(lambda: selection.scores)
    child = selection.fork("flat", 0.1)
    token = torch.tensor([1], device="cuda")
    full_s, _ = seconds(lambda: [parent.logits(token) for _ in range(10)])
    child_s, _ = seconds(lambda: [child.logits(token) for _ in range(10)])
    record(f"| {n} | {prefill_s:.2f} | {score_s:.4f} ({score_s / prefill_s:.2%}) | "
           f"{full_s * 100:.1f} / {child_s * 100:.1f} | {torch.cuda.max_memory_allocated() / 2**30:.1f} |")
    parent.release()
    child.release()


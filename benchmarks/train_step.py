"""Training-step throughput of the default model's architecture: transformers' fallback GDN kernel against the
project's exact ``solve_triangular`` kernel, float32 and bf16 autocast, in one run (tokens/s, median of 3 steps
after one warm-up step; forward + backward + AdamW on the shipped recipe's data).

    python benchmarks/train_step.py [batch×length ...]      (default: 32x128 2x2048)
"""

import random
import sys
import time

import torch
from transformers import Qwen3_5ForCausalLM

from hybridmodel.data import batch
from hybridmodel.tokenizer import build_tokenizer
from hybridmodel.train import PHASE2_MIX, install_fast_kernel, model_config, row_mean_loss


def tokens_per_second(fast_kernel: bool, bf16: bool, size: int, length: int) -> float:
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(model_config(len(tokenizer)))
    if fast_kernel:
        install_fast_kernel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids, labels = batch(tokenizer, random.Random(0), size, length, PHASE2_MIX)
    seconds = []
    for _ in range(4):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(ids).logits
        loss = row_mean_loss(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seconds.append(time.perf_counter() - start)
    return size * length / sorted(seconds[1:])[1]


def main(shapes):
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| batch × length | fallback fp32 | fallback bf16 | solve_triangular fp32 | solve_triangular bf16 | "
          "speed-up (bf16) |")
    print("|---|---|---|---|---|---|")
    for size, length in shapes:
        rates = {(fast, bf16): tokens_per_second(fast, bf16, size, length) for fast in (False, True)
                 for bf16 in (False, True)}
        print(f"| {size} × {length} | {rates[False, False]:.0f} | {rates[False, True]:.0f} | {rates[True, False]:.0f} "
              f"| {rates[True, True]:.0f} | {rates[True, True] / rates[False, True]:.2f} |", flush=True)


if __name__ == "__main__":
    shapes = [tuple(int(x) for x in a.split("x")) for a in sys.argv[1:]] or [(32, 128), (2, 2048)]
    main(shapes)

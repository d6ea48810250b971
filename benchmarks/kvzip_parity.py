"""KVzip against kvpress's ``KVzipPress`` on the real model (:mod:`testing.kvzip_parity`): kept positions in all 90
heads and the first answer token's logits, on held-out real text, at several kept fractions.

    OMP_NUM_THREADS=1 python benchmarks/kvzip_parity.py        # writes docs/kvzip_parity_real.md
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from importlib.metadata import version
from pathlib import Path

import torch

from pretrained.loading import load
from runtime import encode_text
from testing.kvzip_parity import chat_prefix, kvzip_parity
from workloads.corpus import documents

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m-instruct"


def real_text(tokenizer, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``tokens`` tokens of held-out real text (a standard-library module) and one question, in the model's ids."""
    text = documents("python-stdlib", "heldout")[0][1]
    question = torch.tensor(encode_text(tokenizer, "\nWhat does this module do?<|im_end|>\n<|im_start|>assistant\n"))
    return torch.tensor(encode_text(tokenizer, text)[:tokens]), question


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1000, help="body tokens after the chat prefix")
    parser.add_argument("--fractions", default="0.1,0.3,0.5,0.7")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "kvzip_parity_real.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model, tokenizer, _ = load(MODEL)
    sink = len(chat_prefix(tokenizer))
    body, question = real_text(tokenizer, args.tokens - (args.tokens + sink) % 10)  # p·n whole for p in tenths
    rows = []
    for p in (float(x) for x in args.fractions.split(",")):
        t0 = time.perf_counter()
        result = kvzip_parity(model, tokenizer, body, question, p)
        rows.append(result)
        print(asdict(result), f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    lines = [
        "# KVzip against kvpress's KVzipPress on SmolLM2-135M-Instruct", "",
        f"kvpress {version('kvpress')}, transformers {version('transformers')}, torch {version('torch')}; "
        f"{rows[0].n_context} context tokens ({rows[0].n_sink} of them the chat template's prefix, kvpress's "
        f"`n_sink` and this project's `protected`) of held-out real text; this project's `kvzip` press with the "
        f"`global` allocator at the same whole-size budget. Command:", "",
        "```bash", f"OMP_NUM_THREADS=1 python benchmarks/kvzip_parity.py --tokens {args.tokens} "
        f"--fractions {args.fractions}", "```", "",
        "Where kvpress keeps one entry more, its count `int(L·H·n·r)` was computed in floating point and fell just "
        "below the exact product (90 · 1020 · 0.7 = 64259.99…): the budgets differ, not the scores — the fifth column "
        "checks kvpress's set against this project's global ranking cut at kvpress's own count.", "",
        "| p (of the whole context) | kept (ours / kvpress) | heads with identical kept positions | differing "
        "entries | kvpress's set = our ranking cut at its count | max \\|Δ first-token logit\\| |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r.keep_fraction} | {r.kept_ours} / {r.kept_kvpress} | {r.heads - r.heads_differing} of "
                     f"{r.heads} | {r.entries_differing} | {'yes' if r.kvpress_keeps_our_top_ranked else 'no'} | "
                     f"{r.max_logit_diff:.2e} |")
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

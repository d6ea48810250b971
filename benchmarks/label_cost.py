"""What a labelling window costs (``bench label --futures both``), and what its brute-force checks add.

Labels the same windows three times in one process, one after another: without checks, with the checks as
``bench label`` runs them (eight entries a layer in each sampled future, fewer in a longer future:
:data:`gatesight_learning.labels.CHECKED_TOKENS`), and with eight entries a layer in every future (how the window
asked back was checked before). The labels of the three are asserted equal (checks never change a label); the
seconds a window and their ratios to the unchecked run are printed as a Markdown table.

    OMP_NUM_THREADS=1 python benchmarks/label_cost.py --model smollm2-135m-hybrid --windows 4
"""

from __future__ import annotations

import argparse
import time

import torch

import gatesight_learning.labels as labels_module
from gatesight_learning.record import corpus_windows, label_windows
from pretrained import loading


def _run(model, tokenizer, texts: list[str], check_entries: int, checked_tokens: int) -> tuple[float, list]:
    saved = labels_module.CHECKED_TOKENS
    labels_module.CHECKED_TOKENS = checked_tokens
    try:
        started = time.perf_counter()
        out = label_windows(model, tokenizer, texts, futures="both", check_entries=check_entries)
        return (time.perf_counter() - started) / len(texts), out
    finally:
        labels_module.CHECKED_TOKENS = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-hybrid")
    parser.add_argument("--windows", type=int, default=4, help="windows labelled together (bench label --together)")
    parser.add_argument("--tokens", type=int, default=1024)
    args = parser.parse_args()
    model, tokenizer, _ = loading.load(loading.resolve(args.model))
    texts = [text for _, _, text in corpus_windows(tokenizer, args.tokens, limit=args.windows)]
    runs = {"no checks": (0, labels_module.CHECKED_TOKENS),
            "checks as bench label runs them": (8, labels_module.CHECKED_TOKENS),
            "8 entries a layer in every future": (8, 10**9)}
    seconds, first = {}, None
    for name, (entries, tokens) in runs.items():
        seconds[name], out = _run(model, tokenizer, texts, entries, tokens)
        for window, reference in zip(out, first or out):
            for kind, layers in window[1].items():
                for layer, label in layers.items():
                    torch.testing.assert_close(label, reference[1][kind][layer], rtol=0, atol=0)
        first = first or out
    base = seconds["no checks"]
    print(f"{args.windows} windows of {args.tokens} tokens labelled together, both futures, "
          f"{torch.get_num_threads()} thread(s)\n")
    print("| run | s a window | × no checks |\n|---|---|---|")
    for name, value in seconds.items():
        print(f"| {name} | {value:.1f} | {value / base:.2f} |")


if __name__ == "__main__":
    main()

"""Where in the context each method's kept entries lie (``python benchmarks/kept_positions.py [--model M]
[--methods A/B,...] [--keep-fractions P,...] [--task T] [--haystack H] [--n N] [--length L]``).

For ``n`` contexts of a task, the evictable body ``[protected, n)`` is cut into ten equal spans, oldest first; a
cell is the share of a span's entries a method keeps at kept fraction p, over every attention layer and KV head
and the contexts. A scorer that rewards recency fills the last spans and empties the first; a cache that must
answer any later question has to keep a needle wherever it sits, so the row ``needles`` gives where the contexts'
needle sentences lie. Markdown on standard output.
"""

from __future__ import annotations

import argparse

import torch

from bench.run.harness import Harness
from bench.run.needles import needle_positions
from bench.run.plan import plan
from bench.run.settings import CompareSettings

SPANS = 10


def span_shares(positions: torch.Tensor, protected: int, n: int) -> torch.Tensor:
    """``[SPANS]`` counts of ``positions`` (absolute, in ``[protected, n)``) in each tenth of the body."""
    span = ((positions - protected) * SPANS // (n - protected)).clamp(max=SPANS - 1)
    return torch.bincount(span, minlength=SPANS).double()


def span_sizes(protected: int, n: int) -> torch.Tensor:
    return span_shares(torch.arange(protected, n), protected, n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-hybrid")
    parser.add_argument("--methods", default="gatesight/gate,kvzip/global,keydiff/flat")
    parser.add_argument("--keep-fractions", default="0.1,0.5")
    parser.add_argument("--task", default="niah_single_2")
    parser.add_argument("--haystack", default="manpages")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--length", type=int, default=2048)
    args = parser.parse_args()
    fractions = [float(p) for p in args.keep_fractions.split(",")]
    run = plan(CompareSettings(presses=[], pairs=args.methods.split(","), keep_fractions=fractions,
                               tasks=[args.task], n=args.n, length=args.length, model=args.model,
                               haystack=args.haystack))
    h = Harness(run, run.model.identity)
    kept = {(m.label, p): torch.zeros(SPANS, dtype=torch.float64) for m in run.methods for p in fractions}
    sizes, needles = torch.zeros(SPANS, dtype=torch.float64), torch.zeros(SPANS, dtype=torch.float64)
    heads = len(h.adapter.attention_layers) * h.adapter.geometry.num_kv_heads
    for index in range(args.n):
        item = h.item(args.task, index)
        context = h.encode(item.context)
        protected = len(h.encode(item.protected_text))
        parent = h.engine.prefill(context, protected, list(run.presses))  # scored once by each press
        sizes += span_sizes(protected, parent.n) * heads
        for question in item.questions:
            needles += span_shares(needle_positions(h.encode_list, item.context, question.needles), protected,
                                   parent.n)
        for method in run.methods:
            for p in fractions:
                keep = parent.selections[method.press].plan(h.allocators[method.allocator], p)
                kept[method.label, p] += sum(span_shares(positions, protected, parent.n)
                                             for heads_of_layer in keep.layers.values() for positions in heads_of_layer)
        parent.release()
    print(f"# Kept share of each tenth of the body, oldest first ({args.model}, {args.task}@{args.haystack}, "
          f"{args.length} tokens, n = {args.n} contexts, every attention layer and KV head)\n")
    print("| method | p | " + " | ".join(f"{k + 1}" for k in range(SPANS)) + " |")
    print("|---|---|" + "---|" * SPANS)
    for (method, p), counts in kept.items():
        print(f"| {method} | {p:g} | " + " | ".join(f"{share:.2f}" for share in (counts / sizes).tolist()) + " |")
    share = (needles / needles.sum()).tolist()
    print("| needles (share of needle tokens) | | " + " | ".join(f"{s:.2f}" for s in share) + " |")


if __name__ == "__main__":
    main()

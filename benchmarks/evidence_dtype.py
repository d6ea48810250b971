"""Evidence memory of GateSight and what storing its GDN signals in bfloat16 changes (``python
benchmarks/evidence_dtype.py [LENGTH]``): bytes per token, and the overlap of the kept sets at p = 0.05 / 0.1 / 0.2
between float32 and bfloat16 signals on the shipped model, over held-out text."""

import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import presses
from pretrained.loading import DEFAULT_MODEL_DIR
from runtime import encode_text, prefill
from workloads.corpus import SOURCES, documents


def main(length: int = 4096) -> None:
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR, local_files_only=True)
    lines = [f"# GateSight evidence: float32 against bfloat16 GDN signals ({length} tokens, shipped model)", "",
             "| document | evidence bytes/token fp32 / bf16 | kept-set overlap p=0.05 | p=0.1 | p=0.2 |",
             "|---|---|---|---|---|"]
    for source in SOURCES:
        text = "\n\n".join(t for _, t in documents(source, "heldout")[:20])
        ids = torch.tensor(encode_text(tokenizer, text)[:length])
        plans, sizes = {}, {}
        for dtype in ("float32", "bfloat16"):
            press = presses.get("gatesight", signal_dtype=dtype)
            parent = prefill(model, ids, protected=16, evidence=press.evidence(None))
            sizes[dtype] = sum(s.nbytes for s in parent.evidence.recurrent_signals.values()) / parent.n
            selection = presses.Selection(parent, press)
            plans[dtype] = {p: selection.plan("flat", p) for p in (0.05, 0.1, 0.2)}
        cells = []
        for p in (0.05, 0.1, 0.2):
            a, b = plans["float32"][p], plans["bfloat16"][p]
            same = sum(len(set(x.tolist()) & set(y.tolist())) for layer in a.layers
                       for x, y in zip(a.layers[layer], b.layers[layer]))
            cells.append(f"{same / a.total():.4f}")
        lines.append(f"| {source} | {sizes['float32']:.0f} / {sizes['bfloat16']:.0f} | " + " | ".join(cells) + " |")
    print("\n".join(lines))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))

"""Which layers of SmolLM2's distilled hybrid should be attention: KL-guided selection, measured on the hybrid.

The field's recipe (KL-guided layer selection, Li, Yang et al., ICLR 2026; ``fla-org/hybrid-distillation``) restores
one layer of a linear student to the teacher's attention, measures how far the distillation KL falls, and keeps the
K most useful. Here it runs on top of the hybrid's 8 attention layers (the teacher's retrieval layers): each of the
22 GDN layers in turn becomes attention again — the teacher's, converted in the q/k norms' linear regime as phase 4
converts every attention layer (:func:`hybridmodel.from_teacher.resplit`), with no training — and the KL(teacher ‖
hybrid) per token is measured on held-out windows of two kinds: plain text and copy windows (a span repeated; the
KL on the repeats alone is reported too). The layers are ranked by the KL they remove; the hybrids with the best 2
and 4 added (10 and 12 attention layers) are then asked the NIAH questions of the layer-split study (20: the first
question of items 0-9 of niah_single_2 and niah_multikey_1, manual pages, 2,048 tokens, greedy) beside the 8-layer
hybrid and the teacher, and the KV cache per token of each is counted.

A restored layer is not trained: the measure is what the layer's attention brings before the rest of the model
adapts to it, the same proxy the recipe's selection step uses. The 10- and 12-layer rows are an upper bound on
neither side: training could make the new layers better (adapted) or the freed GDN layers' loss matter less.

    OMP_NUM_THREADS=1 python benchmarks/layer_selection.py --delta models/in-progress/smollm2-135m-hybrid-phase4 \
        --out docs/hybrid/layer-selection/selection.json

One thread, float32; about 1 core-hour (22 restored hybrids × 4 windows, then 3 × 20 questions).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from teacher_layer_split import answer, questions

from hybridmodel import hybrid_delta
from hybridmodel.distill import CopyWindows, Windows
from hybridmodel.from_teacher import attention_layers_of, resplit
from hybridmodel.train import install_fast_kernel
from pretrained import loading

SEED = 1002
"""The held-out windows' seed: those of ``benchmarks/qk_norm_regime.py``'s perplexity (the plain ones)."""


@torch.no_grad()
def kl_per_token(teacher, model, windows: list[dict]) -> dict:
    """Mean KL(teacher ‖ model) per predicted token over ``windows``, all positions and the copy windows' repeats
    (every token of a repeat but its first, as :func:`hybridmodel.distill.retrieval_probe` counts them)."""
    total, count, repeat_total, repeat_count = 0.0, 0, 0.0, 0
    for window in windows:
        target = F.log_softmax(window["teacher_logits"], -1)
        log_q = F.log_softmax(model(window["ids"]).logits.float()[0], -1)
        kl = (target.exp() * (target - log_q)).sum(-1)[:-1]  # the last position predicts nothing in the window
        total, count = total + kl.sum().item(), count + kl.numel()
        if window["repeat"] is not None:
            start, end = window["repeat"]
            repeat_total += kl[start:end - 1].sum().item()
            repeat_count += end - 1 - start
    return {"kl": total / count, "kl_repeats": repeat_total / repeat_count, "tokens": count}


def accuracy(model, tokenizer, items) -> dict:
    began = time.time()
    scores = [answer(model, tokenizer, q)[0] for q in items]
    return {"correct": int(sum(scores)), "questions": len(scores), "scores": scores,
            "seconds": round(time.time() - began)}


def kv_bytes_per_token(model) -> int:
    """Bytes of attention KV cache per context token in bfloat16: 2 (K and V) × KV heads × head dim × 2 bytes per
    attention layer."""
    config = model.config
    return len(attention_layers_of(model)) * 2 * config.num_key_value_heads * config.head_dim * 2


def hybrid_with(student, teacher, layers: tuple[int, ...], sample: torch.Tensor):
    """``student`` with attention at ``layers``: its own trained attention and GDN layers where it has them, the
    teacher's attention converted afresh at the layers it adds."""
    model, _ = resplit(student, teacher, tuple(sorted(layers)), sample)
    model.float().eval()
    install_fast_kernel(model)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delta", type=Path, required=True, help="the hybrid's delta (bench distill --out DIR)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--windows", type=int, default=2, help="held-out windows of each kind")
    parser.add_argument("--length", type=int, default=2048)
    args = parser.parse_args()
    if args.out.exists():
        raise SystemExit(f"{args.out} exists; give another --out")
    torch.set_num_threads(1)
    teacher, tokenizer, _ = loading.load("smollm2-135m-instruct")
    teacher.float().eval()
    student = hybrid_delta.build(args.delta, teacher)
    kept = attention_layers_of(student)
    plain = Windows(tokenizer, "heldout", args.length, SEED)
    copies = CopyWindows(tokenizer, "heldout", args.length, SEED)
    windows = [{"ids": plain(k), "repeat": None} for k in range(args.windows)]
    windows += [{"ids": ids, "repeat": repeat} for ids, _, repeat in (copies(k) for k in range(args.windows))]
    with torch.no_grad():
        for window in windows:
            window["teacher_logits"] = teacher(window["ids"]).logits.float()[0]
    sample = plain(0)[:, :1024]  # what the conversion's q/k mean squares are measured on
    result = {"delta": str(args.delta), "attention_layers": list(kept), "windows_per_kind": args.windows,
              "length": args.length, "added": {}}
    base = hybrid_with(student, teacher, kept, sample)
    result["base"] = kl_per_token(teacher, base, windows)
    print(f"8 layers {kept}: {result['base']}", flush=True)
    for layer in (i for i in range(teacher.config.num_hidden_layers) if i not in kept):
        began = time.time()
        result["added"][layer] = kl_per_token(teacher, hybrid_with(student, teacher, kept + (layer,), sample),
                                              windows)
        result["added"][layer]["seconds"] = round(time.time() - began)
        print(f"+ layer {layer}: {result['added'][layer]}", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")  # a killed run keeps what it measured
    ranked = sorted(result["added"], key=lambda layer: result["added"][layer]["kl"])
    result["ranked"] = ranked
    items = questions(tokenizer, ["niah_single_2", "niah_multikey_1"], range(10), 2048, "manpages")
    result["teacher"] = accuracy(teacher, tokenizer, items)
    result["niah"] = {}
    for extra in (0, 2, 4):
        layers = tuple(sorted(kept + tuple(ranked[:extra])))
        model = hybrid_with(student, teacher, layers, sample)
        result["niah"][len(layers)] = {"layers": list(layers), "kv_bytes_per_token": kv_bytes_per_token(model),
                                       **accuracy(model, tokenizer, items)}
        print(f"{len(layers)} layers {layers}: {result['niah'][len(layers)]['correct']}/{len(items)}", flush=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

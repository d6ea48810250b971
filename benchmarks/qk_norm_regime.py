"""What Qwen3.5's per-head q/k RMS norms cost a converted attention layer: the teacher with its q and k normalised
as the phases 1-3 conversion normalised them in the hybrid's kept layers (``docs/hybrid/qk-norm.md``).

Qwen3.5 normalises every head's q and k (``q_norm``, ``k_norm``, RMS over the head dimension, then a learnt scale);
Llama does not, and its attention logits carry each token's q and k norms. The phases 1-3 conversion set the
learnt scale to the teacher's mean RMS, so every token's q and k took the same norm; today's conversion keeps them
in the norms' linear regime (:data:`hybridmodel.from_teacher.LINEAR_REGIME`).

    python benchmarks/qk_norm_regime.py --out docs/hybrid/qk-norm/teacher.json

NIAH accuracy (the layer-split study's questions: the first question of items 0..n-1 of niah_single_2 and
niah_multikey_1, manual pages, 2,048 tokens; greedy) of the teacher as it is, with its q and k RMS-normalised per
head to the layer's mean RMS in the hybrid's 8 attention layers, and in all 30. One thread, float32; about 30
minutes on an idle core.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from teacher_layer_split import answer, questions

from pretrained import loading

KEPT = (7, 8, 14, 17, 18, 20, 21, 23)


def saturated_norm_hooks(model, layers, scales: dict[int, tuple[float, float]]) -> list:
    """Forward hooks that RMS-normalise each head of q and k (``q_proj``/``k_proj`` outputs) of ``layers`` to the
    layer's mean RMS, as the phases 1-3 conversion's norms did."""
    hooks = []
    for index in layers:
        attention = model.model.layers[index].self_attn
        d = attention.head_dim
        for projection, rms in ((attention.q_proj, scales[index][0]), (attention.k_proj, scales[index][1])):
            def normalise(module, args, output, rms=rms, d=d):
                x = output.unflatten(-1, (-1, d))
                return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * rms).flatten(-2)

            hooks.append(projection.register_forward_hook(normalise))
    return hooks


@torch.no_grad()
def mean_rms(teacher, sample_ids: torch.Tensor) -> dict[int, tuple[float, float]]:
    """``{layer: (mean RMS of q, of k)}`` over the heads and tokens of ``sample_ids``: the scale the phases 1-3
    conversion gave the norms."""
    scales, hooks = {}, []
    for index, layer in enumerate(teacher.model.layers):
        attention = layer.self_attn

        def record(module, args, kwargs, index=index, attention=attention):
            x = kwargs["hidden_states"]
            q = attention.q_proj(x).unflatten(-1, (-1, attention.head_dim))
            k = attention.k_proj(x).unflatten(-1, (-1, attention.head_dim))
            scales[index] = (q.pow(2).mean(-1).sqrt().mean().item(), k.pow(2).mean(-1).sqrt().mean().item())

        hooks.append(attention.register_forward_pre_hook(record, with_kwargs=True))
    teacher(sample_ids)
    for hook in hooks:
        hook.remove()
    return scales


def accuracy(model, tokenizer, items) -> dict:
    began = time.time()
    scores = [answer(model, tokenizer, q)[0] for q in items]
    return {"accuracy": sum(scores) / len(scores), "scores": scores, "seconds": round(time.time() - began)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10, help="items per task (their first question each)")
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    teacher, tokenizer, _ = loading.load("smollm2-135m-instruct")
    teacher.eval()
    items = questions(tokenizer, ["niah_single_2", "niah_multikey_1"], range(args.n), args.length, "manpages")
    sample = items[0]["ids"][:, :1024]
    result = {"questions": len(items)}
    rms = mean_rms(teacher, sample)
    for name, layers in (("as it is", ()), ("q/k normalised in the 8 kept layers", KEPT),
                         ("q/k normalised in every layer", range(30))):
        hooks = saturated_norm_hooks(teacher, layers, rms)
        result[name] = accuracy(teacher, tokenizer, items)
        for hook in hooks:
            hook.remove()
        print(name, result[name]["accuracy"], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

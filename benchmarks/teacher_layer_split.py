"""Which of the teacher's layers must keep full attention for it to still retrieve: the layer-split question of the
distilled hybrid, asked of the teacher itself.

A GDN layer carries a fixed-size state; it cannot look up a 4-digit value 2,000 tokens back the way a full attention
head does. As a proxy, every layer outside a kept set ``S`` attends only to a local window (plus the first tokens,
the attention sink); the teacher then answers NIAH questions greedily and is scored as the benchmark scores it. A
split under which the teacher itself cannot retrieve cannot be rescued by distilling the other layers into GDN.

Beside it, each (layer, head)'s retrieval score: the attention mass that the positions predicting the answer put on
the needle's value tokens in the context (full attention, the teacher's own greedy answer), averaged over items. The
``top`` split keeps the layers with the largest head score, chosen on other items than those it is evaluated on.

    python benchmarks/teacher_layer_split.py --n 10 --select 5 --out docs/realmodel/layer-split/teacher.json

One thread, about 4 minutes a split on 20 questions at 2,048 tokens (docs/realmodel/layer-split/README.md).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from hybridmodel.from_teacher import attention_placement
from pretrained import loading
from runtime import encode_text
from workloads.metrics import METRICS
from workloads.tasks import Config, generate


def window_hooks(model, full_layers: set[int], window: int, sink: int) -> list:
    """Pre-hooks giving every decoder layer outside ``full_layers`` a sink + sliding-window mask (prefill and decode:
    the query positions come from ``cache_position``)."""
    handles = []
    for index, layer in enumerate(model.model.layers):
        if index in full_layers:
            continue

        def hook(module, args, kwargs):
            positions = kwargs["cache_position"]  # [q]
            keys = torch.arange(int(positions[-1]) + 1)
            distance = positions[:, None] - keys[None, :]
            allowed = (distance >= 0) & ((distance < window) | (keys[None, :] < sink))
            mask = torch.zeros(allowed.shape, dtype=kwargs["hidden_states"].dtype)
            kwargs["attention_mask"] = mask.masked_fill(~allowed, float("-inf"))[None, None]
            return args, kwargs

        handles.append(layer.self_attn.register_forward_pre_hook(hook, with_kwargs=True))
    return handles


def questions(tokenizer, tasks: list[str], indices: range, length: int, haystack: str) -> list[dict]:
    """The first question of the items ``indices`` of each task: its ids, the needle's token positions and gold
    answers."""
    out = []
    count = lambda text: len(encode_text(tokenizer, text))  # noqa: E731
    for task in tasks:
        cfg = Config(length=length, count_tokens=count, haystack=haystack)
        for index in indices:
            item = generate(task, index, 0, cfg)
            q = item.questions[0]
            encoded = tokenizer(item.context, add_special_tokens=False, return_offsets_mapping=True)
            start = item.context.find(q.answers[0])
            end = start + len(q.answers[0])
            needle = [i for i, (a, b) in enumerate(encoded["offset_mapping"]) if a < end and b > start]
            ids = encoded["input_ids"] + encode_text(tokenizer, q.prompt)
            out.append({"task": task, "item": index, "ids": torch.tensor(ids)[None], "needle": needle,
                        "answers": q.answers, "metric": item.metric, "max_new": q.max_new_tokens})
    return out


@torch.no_grad()
def answer(model, tokenizer, question: dict) -> tuple[float, list[int]]:
    out = model.generate(question["ids"], max_new_tokens=question["max_new"], do_sample=False,
                         pad_token_id=tokenizer.eos_token_id)
    new = out[0, question["ids"].shape[1]:].tolist()
    return METRICS[question["metric"]](tokenizer.decode(new, skip_special_tokens=True), question["answers"]), new


@torch.no_grad()
def retrieval_scores(model, tokenizer, question: dict, generated: list[int]) -> torch.Tensor | None:
    """``[layers, heads]`` attention mass on the needle from the positions predicting the answer's tokens."""
    prompt = question["ids"].shape[1]
    text, predicting = "", []
    for k, token in enumerate(generated):
        before = len(text)
        text += tokenizer.decode([token])
        where = text.find(question["answers"][0])
        if where >= 0 or any(ch.isdigit() for ch in text[before:]):
            predicting.append(prompt + k - 1)
        if where >= 0:
            break
    if not predicting or not question["needle"]:
        return None
    ids = torch.cat([question["ids"], torch.tensor(generated)[None]], 1)
    attentions = model(ids, output_attentions=True).attentions  # per layer [1, H, N, N]
    rows = torch.tensor(predicting)
    needle = torch.tensor(question["needle"])
    return torch.stack([a[0][:, rows][:, :, needle].sum(-1).mean(-1) for a in attentions])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tasks", default="niah_single_2,niah_multikey_1")
    parser.add_argument("--n", type=int, default=10, help="items per task the splits are evaluated on (0..n-1)")
    parser.add_argument("--select", type=int, default=5,
                        help="items per task (1000, 1001, ...: none of the evaluated ones) the top split is chosen on")
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--haystack", default="manpages")
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--sink", type=int, default=4)
    parser.add_argument("--keep", default="7", help="comma list: a top split per count of layers kept")
    parser.add_argument("--baselines", action=argparse.BooleanOptionalAction, default=True,
                        help="also evaluate Qwen3.5's every fourth layer and no full-attention layer")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.manual_seed(0)

    model, tokenizer, _ = loading.load(args.model)
    model.eval()
    layers = len(model.model.layers)
    tasks = args.tasks.split(",")
    items = questions(tokenizer, tasks, range(args.n), args.length, args.haystack)
    chosen_on = questions(tokenizer, tasks, range(1000, 1000 + args.select), args.length, args.haystack)

    full = [answer(model, tokenizer, q)[0] for q in items]
    generated = [answer(model, tokenizer, q)[1] for q in chosen_on]
    model.set_attn_implementation("eager")
    per_item = [s for q, g in zip(chosen_on, generated)
                if (s := retrieval_scores(model, tokenizer, q, g)) is not None]
    model.set_attn_implementation("sdpa")
    heads = torch.stack(per_item).mean(0)  # [layers, heads]
    splits = {"all layers": tuple(range(layers))}
    if args.baselines:
        splits["qwen3.5 (every 4th)"] = attention_placement(layers)
    for keep in map(int, args.keep.split(",")):
        splits[f"top {keep} by head retrieval score"] = tuple(sorted(int(i) for i in heads.amax(1).topk(keep).indices))
    if args.baselines:
        splits["none"] = ()
    result = {"model": args.model, "tasks": args.tasks, "n_questions": len(items),
              "selection_questions": len(per_item), "length": args.length,
              "haystack": args.haystack, "window": args.window, "sink": args.sink,
              "head_score_max_per_layer": [round(float(v), 4) for v in heads.amax(1)],
              "head_score_sum_per_layer": [round(float(v), 4) for v in heads.sum(1)], "splits": {}}
    for name, kept in splits.items():
        began = time.time()
        if name == "all layers":
            scores = full
        else:
            handles = window_hooks(model, set(kept), args.window, args.sink)
            scores = [answer(model, tokenizer, q)[0] for q in items]
            for handle in handles:
                handle.remove()
        result["splits"][name] = {"layers": list(kept), "accuracy": sum(scores) / len(scores),
                                  "scores": scores, "seconds": round(time.time() - began, 1)}
        print(f"{name:>36}: {100 * sum(scores) / len(scores):5.1f} % ({len(scores)} questions) layers {list(kept)}",
              flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("head retrieval score, max over heads per layer:",
          " ".join(f"{i}:{v:.2f}" for i, v in enumerate(result["head_score_max_per_layer"])))


if __name__ == "__main__":
    main()

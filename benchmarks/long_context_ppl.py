"""Long-context perplexity of a hybrid against its teacher: whether the model uses what it read 1,800 tokens ago.

A perplexity averaged over whole windows is dominated by positions with little context, where a recurrent layer
does as well as attention; the loss on a document's tokens *after* a long prefix is what retrieval over the
context buys. For each source, the first ``--windows`` documents of at least ``--context + --target`` tokens (in
path order) give one window each: their first ``context + target`` tokens. Each model is scored, teacher forced
and float32, on the whole window and on the last ``--target`` tokens alone; the report gives both perplexities
per model and the ratio model / teacher with a bootstrap 95 % interval over windows (windows resampled, both
models on the same windows).

A source is ``NAME`` (every document) or ``NAME:heldout`` (the documents of its held-out split: for a source the
distillation reads, text it never read). Sources default to two kinds of text that no distillation phase reads:
manual pages (``manpages``, a haystack source) and Perl's POD documentation (``perl-pod``, a labelling source;
distillation reads ``python-stdlib``, ``licenses`` and ``package-docs`` only).

    OMP_NUM_THREADS=1 python benchmarks/long_context_ppl.py --models smollm2-135m-instruct,smollm2-135m-hybrid \
        --out docs/hybrid/long-context-ppl.json
    OMP_NUM_THREADS=1 python benchmarks/long_context_ppl.py --sources python-stdlib:heldout,licenses:heldout ...
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from hybridmodel.train import install_fast_kernel
from pretrained.loading import load
from workloads.corpus import documents


def windows_of(tokenizer, source: str, split: str, count: int, length: int) -> list[tuple[str, torch.Tensor]]:
    """``(path, ids [1, length])`` of the first ``count`` documents of ``source``'s ``split`` (path order) that
    hold ``length`` tokens."""
    out = []
    for path, text in sorted(documents(source, split)):
        ids = tokenizer(text)["input_ids"]
        if len(ids) >= length:
            out.append((path, torch.tensor(ids[:length])[None]))
        if len(out) == count:
            return out
    raise SystemExit(f"{source}: only {len(out)} documents of {length} tokens; ask for fewer windows")


@torch.no_grad()
def token_losses(model, ids: torch.Tensor) -> torch.Tensor:
    """Next-token losses ``[L - 1]`` (float32) of ``ids`` ``[1, L]``."""
    logits = model(ids).logits.float()
    return F.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="none")


def bootstrap_ratio(model: list[float], teacher: list[float], draws: int = 10_000) -> list[float]:
    """95 % interval of exp(mean model loss) / exp(mean teacher loss), windows resampled with replacement."""
    rng = random.Random(0)
    n, ratios = len(model), []
    for _ in range(draws):
        pick = [rng.randrange(n) for _ in range(n)]
        ratios.append(math.exp(sum(model[i] - teacher[i] for i in pick) / n))
    ratios.sort()
    return [ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="smollm2-135m-instruct,smollm2-135m-hybrid",
                        help="the teacher first, then the models compared with it (names or directories)")
    parser.add_argument("--sources", default="manpages,perl-pod")
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--context", type=int, default=1800)
    parser.add_argument("--target", type=int, default=128)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = args.models.split(",")
    length = args.context + args.target
    losses: dict[str, dict[str, list[list[float]]]] = {}  # model -> source -> [window mean loss, target mean loss]
    paths = {}
    for name in names:
        model, tokenizer, _ = load(name)
        model = model.float()
        install_fast_kernel(model)
        losses[name] = {}
        for source in args.sources.split(","):
            name_of_source, _, split = source.partition(":")
            windows = windows_of(tokenizer, name_of_source, split or "all", args.windows, length)
            paths[source] = [path for path, _ in windows]
            rows = []
            for _, ids in windows:
                started = time.perf_counter()
                loss = token_losses(model, ids)
                rows.append([loss.mean().item(), loss[-args.target:].mean().item()])
                print(f"{name} {source} window {len(rows)}: {rows[-1][0]:.3f} / {rows[-1][1]:.3f} nats "
                      f"({time.perf_counter() - started:.1f} s)", flush=True)
            losses[name][source] = rows
        del model
    teacher = names[0]
    report = {"context": args.context, "target": args.target, "windows": args.windows, "paths": paths,
              "losses": losses, "summary": {}}
    for source in args.sources.split(","):
        for name in names:
            rows = losses[name][source]
            entry = {"window_ppl": math.exp(sum(r[0] for r in rows) / len(rows)),
                     "last_ppl": math.exp(sum(r[1] for r in rows) / len(rows))}
            if name != teacher:
                base = losses[teacher][source]
                for i, key in enumerate(("window", "last")):
                    mine, theirs = [r[i] for r in rows], [r[i] for r in base]
                    entry[f"{key}_ratio"] = math.exp(sum(mine) / len(mine) - sum(theirs) / len(theirs))
                    entry[f"{key}_ratio_ci95"] = bootstrap_ratio(mine, theirs)
            report["summary"][f"{source} / {name}"] = entry
            print(source, name, json.dumps(entry))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""This runtime's prefill against transformers' own forward (SDPA) on the real model, in one run: seconds (median
of ``--repeats``) and the peak resident set each adds, at each length.

Three ways over the same real-text tokens: transformers' ``model.model(ids, use_cache=True)`` (the decoder
without its output head, into a ``DynamicCache``: how kvpress's pipeline prefills a context; the head's logits of
every position would add 58 GFLOP at 2,048 tokens that no prefill needs),
:func:`runtime.prefill` with no evidence, and :func:`runtime.prefill` with the evidence of the leaderboard's presses
(SnapKV's window queries, KeyDiff's and Knorm's keys come free). Each is run in its own process so that its peak
(``VmHWM``, reset after the model is loaded) is its own.

    OMP_NUM_THREADS=1 python benchmarks/prefill_real.py [--lengths 2048 4096]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

MODEL = "smollm2-135m-instruct"
WAYS = ("transformers", "prefill", "prefill+evidence")


def _status_mib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) // 1024


def measure(way: str, length: int, repeats: int) -> dict:
    import presses
    from presses.preparation import evidence_for
    from pretrained.loading import load
    from runtime import adapter_for, prefill
    from workloads.corpus import documents

    torch.set_num_threads(1)
    model, tokenizer, _ = load(MODEL)
    text = "\n\n".join(body for _, body in documents("python-stdlib", "heldout")[:8])
    ids = torch.tensor(tokenizer(text[:40 * length])["input_ids"][:length])
    if ids.numel() < length:
        raise SystemExit(f"only {ids.numel()} tokens of held-out text; ask for fewer")
    evidence = evidence_for([presses.get(name) for name in ("snapkv", "keydiff", "kvpress:knorm")],
                            adapter_for(model))

    def once():
        if way == "transformers":
            with torch.no_grad():
                model.model(ids[None], use_cache=True)
        else:
            prefill(model, ids, protected=4, tokenizer=tokenizer,
                    **({"evidence": evidence} if way == "prefill+evidence" else {})).release()

    once()  # warm-up (first-call allocations)
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_mib("VmRSS")
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        once()
        seconds.append(time.perf_counter() - t0)
    return {"way": way, "length": length, "seconds": round(statistics.median(seconds), 3),
            "peak_added_mib": _status_mib("VmHWM") - before}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", nargs="+", type=int, default=[2048, 4096])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.way:
        print(json.dumps(measure(args.way, args.lengths[0], args.repeats)))
        return 0
    print("| tokens | transformers s | prefill s (ratio) | prefill + evidence s (ratio) | peak added MiB "
          "(transformers / prefill / + evidence) |\n|---|---|---|---|---|")
    for length in args.lengths:
        got = {}
        for way in WAYS:
            done = subprocess.run([sys.executable, __file__, "--way", way, "--lengths", str(length), "--repeats",
                                   str(args.repeats)], check=True, stdout=subprocess.PIPE, text=True)
            got[way] = json.loads(done.stdout.strip().splitlines()[-1])
        hf = got["transformers"]["seconds"]
        print(f"| {length} | {hf} | {got['prefill']['seconds']} ({got['prefill']['seconds'] / hf:.2f}) | "
              f"{got['prefill+evidence']['seconds']} ({got['prefill+evidence']['seconds'] / hf:.2f}) | "
              + " / ".join(str(got[w]["peak_added_mib"]) for w in WAYS) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

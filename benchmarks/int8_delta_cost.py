"""What storing a distilled hybrid's delta in int8 (one float32 scale per output row,
:func:`hybridmodel.hybrid_delta.save`) costs against the bfloat16 it was stored in before, on one delta: the same
mixers built twice on the teacher, as stored (a delta written before int8 reads as bfloat16) and after an int8
round trip.

This script writes the two models (``<out>/bf16`` and ``<out>/int8``, full model directories with the teacher's
tokenizer) and, on held-out text, what the rounding changes in the next-token distributions: the mean KL(bf16 ‖
int8) per token, the top-1 agreement, and the perplexity of each. The full-cache NIAH of the two models on the same
questions is then measured with the bench, as for every model here (the int8 model against the bf16 one with
``benchmarks/model_vs_teacher.py``, the bf16 model in the teacher's place)::

    OMP_NUM_THREADS=1 python benchmarks/int8_delta_cost.py --delta models/smollm2-135m-hybrid --out DIR \
        --report docs/hybrid/int8-cost.json
    bench compare --model DIR/bf16 --press none --tasks niah_single_2,niah_multikey_1 --n 10 --length 2048 \
        --haystack manpages --out DIR/niah-bf16          # and DIR/int8 into DIR/niah-int8
    python benchmarks/model_vs_teacher.py --teacher DIR/niah-bf16 --model DIR/niah-int8 --out docs/hybrid/int8-niah.md
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from long_context_ppl import windows_of  # the sibling script's windows (this folder is first on sys.path)
from transformers import AutoModelForCausalLM

from hybridmodel.hybrid_delta import MANIFEST_FILE, TOKENIZER_FILES, build, save
from hybridmodel.train import install_fast_kernel
from pretrained.model_cache import locate


def int8_round_trip(delta: Path, teacher, scratch: Path) -> Path:
    """A copy of ``delta`` whose mixers went through :func:`~hybridmodel.hybrid_delta.save` (int8 rows)."""
    model = build(delta, teacher)
    record = json.loads((delta / MANIFEST_FILE).read_text())
    save(model, scratch, record["teacher_sha256"], record.get("training", {}), log=lambda _: None,
         teacher_weights=record.get("teacher_weights"))
    return scratch


def write_model(model, teacher_dir: Path, out: Path) -> None:
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (teacher_dir / name).exists():
            shutil.copyfile(teacher_dir / name, out / name)


@torch.no_grad()
def compare_on(models: dict[str, torch.nn.Module], windows: list[torch.Tensor]) -> dict:
    """Per window: each model's mean next-token loss, the mean KL(first ‖ second) and the top-1 agreement."""
    rows = []
    for ids in windows:
        logp = {name: F.log_softmax(m(ids).logits.float()[0, :-1], -1) for name, m in models.items()}
        (a, pa), (b, pb) = logp.items()
        target = ids[0, 1:]
        rows.append({f"loss_{a}": -pa.gather(1, target[:, None]).mean().item(),
                     f"loss_{b}": -pb.gather(1, target[:, None]).mean().item(),
                     "kl": (pa.exp() * (pa - pb)).sum(-1).mean().item(),
                     "top1_agree": (pa.argmax(-1) == pb.argmax(-1)).float().mean().item()})
        print(json.dumps(rows[-1]), flush=True)
    return {"windows": rows, **{k: sum(r[k] for r in rows) / len(rows) for k in rows[0]},
            **{f"ppl_{name}": math.exp(sum(r[f"loss_{name}"] for r in rows) / len(rows)) for name in models}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delta", type=Path, default=Path("models/smollm2-135m-hybrid"),
                        help="a delta stored in bfloat16 (written before int8)")
    parser.add_argument("--teacher", default="smollm2-135m-instruct")
    parser.add_argument("--out", type=Path, required=True, help="where the two models are written")
    parser.add_argument("--sources", default="licenses:heldout,python-stdlib:heldout,manpages")
    parser.add_argument("--windows", type=int, default=4, help="windows a source")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--report", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    teacher_dir = locate(args.teacher)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32, local_files_only=True)
    with tempfile.TemporaryDirectory() as scratch:
        built = {"bf16": build(args.delta, teacher), "int8": build(int8_round_trip(args.delta, teacher,
                                                                                   Path(scratch)), teacher)}
    for name, model in built.items():
        if not (args.out / name / "config.json").exists():
            write_model(model, teacher_dir, args.out / name)
        install_fast_kernel(model.eval())
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(teacher_dir)
    report = {"delta": str(args.delta), "tokens": args.tokens, "sources": {}}
    for source in args.sources.split(","):
        name, _, split = source.partition(":")
        windows = [ids for _, ids in windows_of(tokenizer, name, split or "all", args.windows, args.tokens)]
        report["sources"][source] = compare_on(built, windows)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=1) + "\n")
    for source, entry in report["sources"].items():
        print(f"{source}: ppl bf16 {entry['ppl_bf16']:.3f}, int8 {entry['ppl_int8']:.3f} "
              f"(× {entry['ppl_int8'] / entry['ppl_bf16']:.4f}); KL {entry['kl']:.2e} nats/token; top-1 agreement "
              f"{entry['top1_agree']:.4f}")


if __name__ == "__main__":
    main()

"""The ``bench`` command: compare, leaderboard, verify, cost, calibrate, train-model, model-eval, label, train, analyze."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _ratios(text: str) -> list[float]:
    from .compare import RATIO_GRIDS

    return list(RATIO_GRIDS[text]) if text in RATIO_GRIDS else _floats(text)


def _compression_ratios(text: str) -> list[float]:
    """kvpress's compression ratios 1 − p, checked as typed, -> kept fractions p."""
    from presses.selection import keep_fraction_from

    ratios = []
    for typed, value in zip(_names(text), _floats(text)):
        try:
            ratios.append(round(keep_fraction_from(None, value), 10))
        except ValueError:
            raise argparse.ArgumentTypeError(f"compression ratio {typed} is outside [0, 1) (the evicted fraction, "
                                             "1 − kept fraction)") from None
    return ratios


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _part(text: str) -> tuple[int, int]:
    index, _, parts = text.partition("/")
    try:
        index, parts = int(index), int(parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected K/N (e.g. 0/2), got {text!r}") from None
    if not 0 <= index < parts:
        raise argparse.ArgumentTypeError(f"part {text}: expected K/N with 0 <= K < N")
    return index, parts


def _options(text: str) -> dict:
    options = {}
    for part in _names(text):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"expected key=value pairs separated by commas, got {part!r}")
        options[key.strip()] = value.strip()  # text: each press or allocator types it by its field
    return options


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="local model directory, or a hub id in the local Hugging Face cache (default: the shipped hybrid)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--dtype", default="float32", help="auto (the checkpoint's), float32, bfloat16 or float16")
    p.add_argument("--allow-download", action="store_true",
                   help="fetch a hub id missing from the local cache (runs are offline otherwise)")


def _spec(args):
    from .loading import ModelSpec

    return ModelSpec(args.model, args.device, args.dtype, args.allow_download)


def cmd_compare(args) -> None:
    from .compare import CompareSettings, expand_tasks, run_compare, run_rows
    from .files import write_text
    from .report import plot_curves, summary_markdown

    ratios = args.compression_ratios if args.compression_ratios is not None else args.ratios
    settings = CompareSettings(
        presses=args.press, allocators=args.alloc, ratios=ratios, tasks=args.tasks, n=args.n,
        length=args.length, model=_spec(args), seed=args.seed, out=Path(args.out), profile=args.profile,
        scbench_data=Path(args.scbench_data) if args.scbench_data else None, jobs=args.jobs, batch=args.batch,
        press_options=args.press_options, alloc_options=args.alloc_options, engine=args.engine,
        haystack=args.haystack,
    )
    store = run_compare(settings)
    rows = run_rows(store, settings)
    text = summary_markdown(rows)
    print(text)
    write_text(settings.out / "summary.md", text)
    png = plot_curves(rows, settings.out / "curves.png",
                      f"{', '.join(settings.presses)} · {', '.join(expand_tasks(settings.tasks))} · "
                      f"{settings.length} tokens · n = {settings.n} per task")
    print(f"results: {store.path}\nplot:    {png}")


def cmd_leaderboard(args) -> None:
    from .report import write_leaderboard

    print(write_leaderboard([Path(s) for s in args.stores], Path(args.out)))


def cmd_verify(args) -> None:
    import difflib
    import tempfile

    from .report import write_leaderboard
    from .store import ResultStore

    stores = [ResultStore(directory, readonly=True) for directory in args.stores]
    rows = [row for store in stores for row in store.rows]
    if not rows:
        raise ValueError(f"no results in {', '.join(args.stores)}")
    for store in stores:
        store.check_rows()
    print(f"{len(rows)} rows complete, every value of its type and range; every no-prune row has ΔNLL = KL = 0")
    if args.docs:
        published = Path(args.docs) / "leaderboard.md"
        with tempfile.TemporaryDirectory() as scratch:
            rebuilt = write_leaderboard([Path(s) for s in args.stores], Path(scratch)).read_text()
        current = published.read_text() if published.exists() else ""
        if rebuilt != current:
            diff = "".join(list(difflib.unified_diff(current.splitlines(True), rebuilt.splitlines(True),
                                                     str(published), "rebuilt from the store"))[:20])
            raise ValueError(f"{published} is not what the store says; run `bench leaderboard` again:\n{diff}")
        print(f"{published} is exactly what the store rebuilds")


def cmd_cost(args) -> None:
    from .cost import run_cost

    run_cost(_spec(args), args.press, args.lengths, Path(args.out))


def cmd_calibrate(args) -> None:
    import os
    import tempfile

    from tqdm import tqdm

    from presses.calibration import calibrate

    from . import loading
    from gatesight_learning.record import recording_chunks

    for flag, value in (("--tokens", args.tokens), ("--chunk", args.chunk)):
        if value < 1:
            raise ValueError(f"{flag} {value}: give a positive number of tokens")
    model, tokenizer, directory = loading.load(_spec(args))
    chunks, sources = recording_chunks(tokenizer, args.tokens, args.chunk)
    with tqdm(total=sum(c.numel() for c in chunks), unit="tok", desc="calibrate") as bar:
        result = calibrate(model, chunks, sources, progress=bar.update)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:  # written whole, then moved into place
        written = result.save(Path(scratch))
        path = directory / written.relative_to(scratch)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(written, path)
    weights = ", ".join(f"{layer}: {w:.3f}" for layer, w in result.gate_weights.items())
    print(f"calibrated on {result.tokens} tokens -> {path}\nlayer gate weights: {weights}")


def cmd_train_model(args) -> None:
    import torch

    from hybridmodel.train import TrainConfig, check_target, train

    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps {args.steps}: give a positive number of training steps")
    out = Path(args.out)
    existing = "resume" if args.resume else "replace" if args.replace else "refuse"
    check_target(out, Path(args.checkpoints), existing)  # before any work: a trained model is never overwritten
    cfg = TrainConfig(seed=args.seed) if args.steps is None else TrainConfig(steps=args.steps, seed=args.seed)
    _spec(argparse.Namespace(model=None, device=args.device, dtype="float32", allow_download=False))  # checks it
    torch.set_num_threads(args.threads)
    train(out, Path(args.checkpoints), cfg, log=lambda line: print(line, flush=True), device=args.device,
          precision=args.dtype, existing=existing)


def cmd_model_eval(args) -> None:
    from hybridmodel.evaluate import evaluate_model

    print(evaluate_model(_spec(args), args.tasks, args.lengths, args.n, args.seed,
                         Path(args.rows) if args.rows else None))


def cmd_label(args) -> None:
    from gatesight_learning.commands import label

    label(_spec(args), Path(args.out), args.limit, args.tokens, args.continuations, args.max_new_tokens, args.seed,
          args.part)


def cmd_train(args) -> None:
    from gatesight_learning.commands import train
    from gatesight_learning.estimator import TrainSettings

    train(_spec(args), Path(args.labels), Path(args.out) if args.out else None, args.slow_threshold,
          TrainSettings(epochs=args.epochs, seed=args.seed), args.futures)


def cmd_analyze(args) -> None:
    from gatesight_learning.commands import analyze

    analyze(_spec(args), Path(args.labels), Path(args.out), args.slow_threshold)


def build_parser() -> argparse.ArgumentParser:
    from .compare import DEFAULT_RATIOS
    from hybridmodel.data import TRAIN_TASKS

    parser = argparse.ArgumentParser(prog="bench", description="Query-agnostic KV compression for hybrid LLMs")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compare", help="score, fork and answer: presses × allocators × kept fractions")
    p.add_argument("--press", type=_names, default=["gatesight"], help="comma list, e.g. gatesight,snapkv,none")
    p.add_argument("--alloc", type=_names, default=["flat"], help="comma list of allocators: flat,gate,pyramid,global")
    fractions = p.add_mutually_exclusive_group()
    fractions.add_argument("--ratios", type=_ratios, default=list(DEFAULT_RATIOS),
                           help="kept fractions p in (0, 1], or a grid: default (0.02, 0.05, 0.1 … 0.9) or paper "
                                "(0.1 … 0.9)")
    fractions.add_argument("--compression-ratios", type=_compression_ratios, default=None,
                           help="kvpress's naming: fractions evicted, 1 − p in [0, 1) (rows still record p); instead "
                                "of --ratios")
    p.add_argument("--tasks", type=_names, default=["ruler"], help="task names or groups (ruler, niah)")
    p.add_argument("--n", type=int, default=2, help="items per task")
    p.add_argument("--length", type=int, default=1024, help="context length in tokens (question included)")
    _model_args(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results")
    p.add_argument("--profile", default="compact", help="RULER template profile: compact or faithful")
    p.add_argument("--haystack", default="generated",
                   help="the essay haystack of the tasks that read one (group 'haystack'): generated, or real text "
                        "nothing here trains on: manpages or nodejs-docs (rows and summaries name it)")
    p.add_argument("--scbench-data", default=None, help="local microsoft/SCBench copy (jsonl dir or datasets cache)")
    p.add_argument("--press-options", type=_options, default={},
                   help="key=value,... for every press of the run (e.g. window=64 for snapkv; a kvpress:<Class> "
                        "takes its own fields); rows name the press with its options")
    p.add_argument("--alloc-options", type=_options, default={},
                   help="key=value,... for every allocator (e.g. weights=1/2/3 for perlayer, safeguard=0.1 for adakv)")
    p.add_argument("--batch", type=int, default=32,
                   help="compacted children of one context answered together (memory: their caches, padded)")
    p.add_argument("--jobs", type=int, default=1,
                   help="worker processes, one context at a time each (each loads the model; one core each)")
    p.add_argument("--engine", default="hf", choices=["hf", "vllm"],
                   help="hf: this project's runtime; vllm: compaction inside vLLM (serving environment; presses "
                        "keydiff, gatesight, triattention; allocator flat)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("leaderboard", help="leaderboard.md, CSV and PNG from result stores")
    p.add_argument("stores", nargs="+", help="result directories written by compare")
    p.add_argument("--out", default="docs")
    p.set_defaults(func=cmd_leaderboard)

    p = sub.add_parser("verify", help="check the fidelity invariants of stores (and that a leaderboard matches them)")
    p.add_argument("stores", nargs="+", help="result directories written by compare")
    p.add_argument("--docs", default=None, help="also rebuild DOCS/leaderboard.md and fail if it differs")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("cost", help="scoring time per press against prefill time, by context length")
    _model_args(p)
    p.add_argument("--press", type=_names, default=["gatesight", "snapkv", "triattention", "keydiff", "kvzip"])
    p.add_argument("--lengths", type=_ints, default=[1024, 4096, 16384])
    p.add_argument("--out", default="results/cost")
    p.set_defaults(func=cmd_cost)

    p = sub.add_parser("calibrate", help="TriAttention query statistics and layer gate weights, stored with the model")
    _model_args(p)
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--chunk", type=int, default=4096)
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("train-model", help="train the default hybrid from scratch (resumable); a trained model in "
                                           "--out is never written over unless --resume or --replace says so (the "
                                           "old directory is then moved aside to <out>.backup-<time>)")
    p.add_argument("--out", default="models/hybrid-byte-12l")
    p.add_argument("--checkpoints", default="checkpoints/hybrid-byte-12l")
    p.add_argument("--steps", type=int, default=None, help="total steps (default: the shipped recipe's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--dtype", default="auto",
                   help="auto (the recipe: bf16 autocast from the 512-token stage on), float32 or bfloat16")
    existing = p.add_mutually_exclusive_group()
    existing.add_argument("--resume", action="store_true",
                          help="--out holds a trained model: continue training it from --checkpoints into --out")
    existing.add_argument("--replace", action="store_true",
                          help="--out holds a trained model: train anew into --out")
    p.set_defaults(func=cmd_train_model)

    p = sub.add_parser("model-eval", help="full-cache accuracy of a model on held-out task items")
    _model_args(p)
    p.add_argument("--tasks", type=_names, default=list(TRAIN_TASKS))
    p.add_argument("--lengths", type=_ints, default=[1024, 2048, 4096])
    p.add_argument("--n", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rows", default=None, help="also write one JSON line per answered question here")
    p.set_defaults(func=cmd_model_eval)

    p = sub.add_parser("label", help="GateSight utility labels (Eq. 2) and GDN signals on held-out generic text")
    _model_args(p)
    p.add_argument("--out", default="results/labels")
    p.add_argument("--limit", type=int, default=None, help="at most this many documents")
    p.add_argument("--tokens", type=int, default=1024, help="tokens per document window")
    p.add_argument("--continuations", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--part", type=_part, default=(0, 1),
                   help="K/N: label windows K, K+N, … only, so N processes share the corpus (one --out)")
    p.set_defaults(func=cmd_label)

    p = sub.add_parser("train", help="train the GateSight estimator (+ ridge, leave-one-corpus-out evaluation)")
    _model_args(p)
    p.add_argument("--labels", default="results/labels")
    p.add_argument("--out", default=None, help="artifact directory (default: <model>/gatesight)")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--futures", default="both", choices=["labels", "reconstruction", "both"],
                   help="which utility labels to fit: both (default: the maximum of the two; measured better on "
                        "real text, docs/realtext.md), labels (the paper's recipe: sampled continuations only) or "
                        "reconstruction (the window asked back)")
    p.add_argument("--slow-threshold", type=float, default=64.0, help="half-life (tokens) of a slow GDN head")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("analyze", help="the paper's observations 1-2 on this model, tables and PNGs")
    _model_args(p)
    p.add_argument("--labels", default="results/labels")
    p.add_argument("--out", default="results/analysis")
    p.add_argument("--slow-threshold", type=float, default=64.0)
    p.set_defaults(func=cmd_analyze)
    return parser


def _quiet_transformers() -> None:
    """No per-weight "Loading weights" bar, and no flash-linear-attention "fast path is not available" warning:
    the runtime drives the GDN layers with its own kernel (runtime/gdn.py) and never calls those fast paths."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command not in ("leaderboard", "verify"):
        _quiet_transformers()
    try:
        args.func(args)
    except (ValueError, FileNotFoundError) as error:
        print(f"bench {args.command}: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # a full or read-only disk: what was written stays, a rerun resumes
        where = f"{error.filename}: " if error.filename else ""
        print(f"bench {args.command}: error: {where}{error.strerror or error}; what was finished is kept",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        where = f" in {args.out}" if getattr(args, "out", None) else ""
        print(f"\nbench {args.command}: interrupted; what was finished is kept{where} — run the same command again "
              "to resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``bench train-model`` and ``bench model-eval``: the default model's training and its full-cache accuracy (the
distilled hybrid's commands are :mod:`bench.commands.distill_commands`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from artifacts.output_kinds import CHECKPOINTS, TRAINED_MODEL
from artifacts.outputs import Output
from hybridmodel.data import TRAIN_TASKS
from pretrained.loading import ModelSpec
from runtime.errors import UsageError

from ..run.model_eval import rows_output
from .arguments import (
    Command,
    add_model_arguments,
    count,
    ints,
    kept_in,
    model_spec,
    names,
    natural,
)


def add_train_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="models/hybrid-byte-12l")
    parser.add_argument("--checkpoints", default="checkpoints/hybrid-byte-12l")
    parser.add_argument("--steps", type=int, default=None, help="total steps (default: the shipped recipe's)")
    parser.add_argument("--seed", type=natural, default=0)
    parser.add_argument("--threads", type=count, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                        help="auto (the recipe: bf16 autocast from the 512-token stage on), float32 or bfloat16")
    existing = parser.add_mutually_exclusive_group()
    existing.add_argument("--resume", action="store_true",
                          help="--out holds a trained model: continue training it from --checkpoints into --out")
    existing.add_argument("--replace", action="store_true",
                          help="--out holds a trained model: train anew into --out")


def run_train_model(args: argparse.Namespace) -> None:
    import torch  # here, not at the top: ``bench --help`` need not import the training

    from hybridmodel.train import TrainConfig, check_target, train

    if args.steps is not None and args.steps < 1:
        raise UsageError(f"--steps {args.steps}: give a positive number of training steps")
    out = Path(args.out)
    existing = "resume" if args.resume else "replace" if args.replace else "refuse"
    check_target(out, Path(args.checkpoints), existing)  # before any work: a trained model is never overwritten
    cfg = TrainConfig(seed=args.seed) if args.steps is None else TrainConfig(steps=args.steps, seed=args.seed)
    ModelSpec(None, args.device, "float32", False)  # checks --device before the training starts
    torch.set_num_threads(args.threads)
    train(out, Path(args.checkpoints), cfg, log=lambda line: print(line, flush=True), device=args.device,
          precision=args.dtype, existing=existing)


def add_model_eval_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--tasks", type=names, default=list(TRAIN_TASKS),
                        help="generated tasks, comma-separated, or the groups ruler, niah, haystack "
                             "(default: %(default)s)")
    parser.add_argument("--lengths", type=ints, default=[1024, 2048, 4096])
    parser.add_argument("--n", type=count, default=20)
    parser.add_argument("--seed", type=natural, default=0)
    parser.add_argument("--rows", default=None, help="also write one JSON line per answered question to this file")
    parser.add_argument("--replace", action="store_true",
                        help="--rows names the rows of an earlier evaluation: write new ones (the old file is moved "
                             "aside to <rows>.backup-<time>); refused otherwise")


def run_model_eval(args: argparse.Namespace) -> None:
    from ..reports.model_card import accuracy_markdown
    from ..run.model_eval import evaluate_model

    print(accuracy_markdown(*evaluate_model(model_spec(args), args.tasks, args.lengths, args.n, args.seed,
                                            Path(args.rows) if args.rows else None, args.replace)))


TRAIN_MODEL = Command("train-model", "train the default hybrid from scratch (resumable); a trained model in --out is "
                                     "never written over unless --resume or --replace says so (the old directory is "
                                     "then moved aside to <out>.backup-<time>)", add_train_model_arguments,
                      run_train_model, outputs=lambda args: [Output(Path(args.out), "--out", model=Path(args.out),
                                                                    kind_of=TRAINED_MODEL),
                                                             Output(Path(args.checkpoints), "--checkpoints",
                                                                    kind_of=CHECKPOINTS)],
                      interrupted=lambda args: kept_in(args.checkpoints, "the checkpoints written are",
                                                       "rerun with --resume to continue from the last one"))


def _model_eval_interrupted(args: argparse.Namespace) -> str:
    if not args.rows:
        return "nothing was kept (without --rows the rows are not written); it does not resume: run it again"
    if not Path(args.rows).exists():  # no task finished: the rows are written as each does
        return f"no task finished, so nothing was written yet ({args.rows} was not created); run it again"
    return (f"the rows of the tasks it finished are kept in {args.rows}; it does not resume: a rerun evaluates "
            "every task again (with --replace, which moves these rows aside, or another --rows)")


MODEL_EVAL = Command("model-eval", "full-cache accuracy of a model on held-out task items", add_model_eval_arguments,
                     run_model_eval, outputs=lambda args: [rows_output(Path(args.rows), args.replace)] if args.rows
                     else [], interrupted=_model_eval_interrupted)

"""``bench distill`` and ``bench ship-artifacts``: the distilled hybrid's training from a pretrained teacher (its
phases, where it starts from, what it may update in ``--out``) and the GateSight artifacts its delta carries."""

from __future__ import annotations

import argparse
import shutil
from dataclasses import asdict
from pathlib import Path

from artifacts.output_kinds import CHECKPOINTS, DISTILLED_DELTA
from artifacts.outputs import Output
from hybridmodel.distill_config import PHASE_DEFAULTS, TEACHER_SAMPLES, DistillConfig, config_difference
from pretrained.loading import ModelSpec
from runtime.errors import UsageError

from .arguments import (
    Command,
    count,
    did_you_mean,
    kept_in,
    natural,
    nonnegative,
    positive,
    share,
)
from .fetch_command import CACHE_HELP, cache_outputs


def add_distill_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--teacher", default="smollm2-135m-instruct",
                        help="the pretrained teacher, a catalogued name (its file's hash goes into the delta)")
    parser.add_argument("--checkpoints", default="checkpoints/smollm2-135m-hybrid",
                        help="where the run checkpoints and logs (resumed from there when it has a checkpoint)")
    parser.add_argument("--hours", type=nonnegative, default=None,
                        help="checkpoint and stop after this many hours (rerun the same command to go on; 0 trains "
                             "nothing and only writes the delta of --checkpoints' checkpoint to --out)")
    parser.add_argument("--out", default=None,
                        help="write the hybrid's delta (mixers + manifest) here when the run stops, e.g. "
                             "models/smollm2-135m-hybrid; it updates a delta of this run at an earlier step, and "
                             "refuses any other delta there (another run's, or this run's ahead of it) unless "
                             "--replace")
    parser.add_argument("--replace", action="store_true",
                        help="let --out replace any delta (the old one is moved aside to <out>.backup-<time>)")
    parser.add_argument("--init-from", default=None,
                        help="with no checkpoint in --checkpoints: start from this saved delta — continuing its run "
                             "(same settings), or beginning a later --phase from it (the run records the delta's "
                             "directory, mixers SHA-256 and step)")
    parser.add_argument("--threads", type=count, default=1)
    parser.add_argument("--phase", type=int, default=1, choices=tuple(PHASE_DEFAULTS),
                        help="1: the conversion from the teacher; 2: retrieval over long contexts and chat, from "
                             "the phase-1 delta (--init-from); 3: phase 2's text with the attention moved where the "
                             "teacher retrieves (--attention-layers), from a phase-2 delta; 4: recall windows, "
                             "the attention layers converted afresh (q/k in the norms' linear regime), from a "
                             "phase-3 delta; 5: chat (plain requests among the teacher samples) and recall, from the "
                             "phase-4 delta; the settings below default to the phase's "
                             "(hybridmodel/distill_config.py PHASE_DEFAULTS)")
    for flag, kind in (("transfer-steps", natural), ("kd-steps", count), ("length", count), ("kd-lr", positive),
                       ("warmup", natural), ("eval-every", count), ("copy-fraction", share), ("chat-fraction", share),
                       ("chat-pool", natural), ("chat-tokens", count), ("probe-windows", natural),
                       ("recall-fraction", share)):
        name = flag.replace("-", "_")
        phases = "; ".join(f"phase {phase}: {defaults.get(name, getattr(DistillConfig, name))}"
                           for phase, defaults in PHASE_DEFAULTS.items())
        parser.add_argument(f"--{flag}", type=kind, default=None, help=f"default: the phase's ({phases})")
    parser.add_argument("--attention-layers", type=_layer_list, default=None,
                        help="comma list of the full-attention layers (default: the phase's; phase 1 and 2: "
                             "Qwen3.5's every fourth, 3,7,...); a phase begun from a delta of another placement "
                             "moves its attention there and trains the layers that became GDN by attention transfer")
    parser.add_argument("--seed", type=natural, default=0)


def _layer_list(text: str) -> tuple[int, ...]:
    try:
        layers = tuple(int(part) for part in text.split(","))
    except ValueError:
        layers = ()
    if not layers or min(layers) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a comma list of layer indices >= 0, e.g. 7,14,21")
    twice = next((layer for layer in layers if layers.count(layer) > 1), None)
    if twice is not None:
        raise argparse.ArgumentTypeError(f"{text!r}: layer {twice} is named twice; name each attention layer once")
    return tuple(sorted(layers))


def _default_attention_layers(teacher: str) -> tuple[int, ...]:
    """Where the hybrid of ``teacher`` has attention when ``--attention-layers`` is not given, or ``()`` if the
    teacher's config cannot be read (not fetched yet)."""
    from hybridmodel.from_teacher import attention_placement
    from pretrained.loading import read_config, resolve

    try:
        return attention_placement(read_config(resolve(ModelSpec(teacher)))["num_hidden_layers"])
    except (FileNotFoundError, ValueError, KeyError):
        return ()


def _delta_in_the_way(out: Path, cfg: dict, step: int | None = None, teacher: str | None = None) -> str | None:
    """Why the delta in ``out`` is not this run's to update, or None (no delta there, or this run's — the same
    config — at a step this run's delta reaches, ``step`` where known): the result of more work is replaced only
    with ``--replace``. A difference in the default attention placement is shown as ``teacher``'s layers (where
    given)."""
    from hybridmodel.hybrid_delta import MANIFEST_FILE, manifest

    if not (out / MANIFEST_FILE).exists():
        return None
    training = manifest(out).get("training", {})
    theirs = training.get("config")
    try:
        same = theirs is not None and DistillConfig.from_dict(theirs) == DistillConfig.from_dict(cfg)
    except (TypeError, ValueError):
        same = False
    if not same:
        default_layers = _default_attention_layers(teacher) if teacher else ()
        return (f"--out {out} holds the delta of another distillation "
                f"({config_difference(theirs, DistillConfig.from_dict(cfg), default_layers)})")
    if step is not None and step < training.get("step", 0):
        return (f"--out {out} holds this run's delta at step {training['step']}, ahead of this one (step {step}): "
                "its --checkpoints go on from there")
    return None


def run_distill(args: argparse.Namespace) -> None:
    import json

    import torch  # here, not at the top: ``bench --help`` need not import the training

    import pretrained
    from hybridmodel import hybrid_delta
    from hybridmodel.distill import distill
    from hybridmodel.distill_windows import Windows
    from hybridmodel.from_teacher import attention_layers_of, attention_placement, from_teacher, resplit
    from pretrained.loading import load, read_config, resolve

    cfg = DistillConfig.for_phase(args.phase, seed=args.seed, **{
        name: getattr(args, name) for name in ("transfer_steps", "kd_steps", "length", "kd_lr", "warmup", "eval_every",
                                               "copy_fraction", "chat_fraction", "chat_pool", "chat_tokens",
                                               "probe_windows", "attention_layers", "recall_fraction")})
    teacher_entry = pretrained.CHECKPOINTS.get(args.teacher)
    if not isinstance(teacher_entry, pretrained.PackagedCheckpoint):
        packaged = [name for name, c in pretrained.CHECKPOINTS.items() if isinstance(c, pretrained.PackagedCheckpoint)]
        raise UsageError(f"--teacher {args.teacher!r}{did_you_mean(args.teacher, packaged)}: choose a packaged "
                         f"pretrained model ({', '.join(packaged)}); the delta records its file's hash")
    out = Path(args.out) if args.out else None
    in_the_way = _delta_in_the_way(out, asdict(cfg), teacher=args.teacher) if out is not None else None
    if in_the_way and not args.replace:
        raise UsageError(f"{in_the_way}: give another --out, or --replace to write over it (the old delta is moved "
                         f"aside to {out}.backup-<time>)")
    checkpoint = Path(args.checkpoints) / "last.pt"
    init = Path(args.init_from) if args.init_from and not checkpoint.exists() else None
    if checkpoint.exists() and args.init_from:
        print(f"{checkpoint} exists: resuming it (--init-from {args.init_from} is read only by a fresh run)")
    if init is not None and not (init / hybrid_delta.MANIFEST_FILE).is_file():
        raise UsageError(f"--init-from {init}: not a saved delta (no {hybrid_delta.MANIFEST_FILE} in it); give the "
                         "--out of an earlier bench distill (e.g. models/smollm2-135m-hybrid)")
    if args.phase > 1 and init is None and not checkpoint.exists():
        raise UsageError(f"--phase {args.phase} starts from the delta of an earlier phase: give --init-from DELTA "
                         "(e.g. models/smollm2-135m-hybrid)")
    start, origin = _start_from(init, cfg) if init is not None else (None, None)
    if args.hours == 0 and not checkpoint.exists() and start is None:
        raise UsageError(f"--hours 0 trains nothing, and {args.checkpoints} holds no checkpoint (nor does --init-from "
                         "continue a delta of these settings): the delta would be untrained (step 0); give --hours "
                         "> 0, or the --checkpoints of the run whose delta to write")
    layers = read_config(resolve(ModelSpec(args.teacher)))["num_hidden_layers"]
    if any(i >= layers for i in cfg.attention_layers):
        raise UsageError(f"--attention-layers {','.join(map(str, cfg.attention_layers))}: the teacher has layers "
                         f"0..{layers - 1}")
    if init is not None:
        _seed_checkpoints(init, Path(args.checkpoints), continuing=start is not None)
    torch.set_num_threads(args.threads)
    teacher, tokenizer, _ = load(ModelSpec(args.teacher))
    sample = Windows(tokenizer, "train", cfg.length, cfg.seed)(-1)
    transfer_layers = None
    if init is not None:
        student = hybrid_delta.build(init, teacher)
        before, wanted = attention_layers_of(student), attention_placement(layers, cfg.attention_layers)
        if before != wanted or (origin is not None and cfg.fresh_attention):
            student, transfer_layers = resplit(student, teacher, wanted, sample, seed=cfg.seed,
                                               fresh_attention=cfg.fresh_attention)
            print(f"attention at layers {list(wanted)} (before: {list(before)}"
                  f"{'; every attention layer converted afresh from the teacher' if cfg.fresh_attention else ''}); "
                  f"new GDN layers {list(transfer_layers)} (attention transfer: {cfg.transfer_steps} steps)",
                  flush=True)
        elif origin is not None and cfg.transfer_steps:
            raise UsageError(f"--init-from {init} already has its attention at layers {list(wanted)}: a phase begun "
                             "from it trains no attention transfer (give --transfer-steps 0)")
    else:  # a checkpoint, if there is one, overwrites the mixers of this initialisation
        student = from_teacher(teacher, sample, seed=cfg.seed, attention_layers=cfg.attention_layers)
    record = distill(teacher, tokenizer, student, cfg, Path(args.checkpoints), log=lambda line: print(line, flush=True),
                     stop_after_s=None if args.hours is None else args.hours * 3600, start=start, origin=origin,
                     transfer_layers=transfer_layers)
    if out is not None:
        from artifacts.files import backup_path
        from hybridmodel.distill_report import plot

        if record["step"] == 0:
            raise UsageError(f"no delta written: the run stopped before its first step (--hours {args.hours}); "
                             "rerun with more --hours")
        in_the_way = _delta_in_the_way(out, asdict(cfg), record["step"], args.teacher)
        if in_the_way and not args.replace:
            raise UsageError(f"no delta written: {in_the_way}; this run's training is kept in {args.checkpoints} "
                             "(rerun to go on), or give another --out, or --replace")
        if in_the_way:  # --replace: the whole old delta, its log and curves with it, moves aside
            aside = backup_path(out)
            out.rename(aside)
            print(f"the delta that was in {out} moved aside to {aside}")
        hybrid_delta.save(student, out, teacher_entry.sha256, record,
                          teacher_weights=hybrid_delta.weights_digest(resolve(ModelSpec(args.teacher))))
        log = Path(args.checkpoints) / "log.jsonl"
        if log.exists():  # up to the delta's step: a run stopped between checkpoints logged steps it did not keep
            kept = [line for line in log.read_text().splitlines()
                    if line.strip() and json.loads(line)["step"] <= record["step"]]
            (out / "training_log.jsonl").write_text("".join(line + "\n" for line in kept))
            plot(out / "training_log.jsonl", out / "curves.png")
        samples = Path(args.checkpoints) / TEACHER_SAMPLES
        if samples.exists():  # the teacher's conversations travel with the delta: a later run need not sample them
            shutil.copyfile(samples, out / TEACHER_SAMPLES)
        print(f"wrote the hybrid's delta at step {record['step']} to {out} (with its training log and curves)")


def _seed_checkpoints(init: Path, checkpoints: Path, continuing: bool) -> None:
    """A fresh checkpoint directory begun from the delta ``init`` takes what the delta carries: its teacher
    samples (generated once, about 25 s each on one thread) and, when the delta's run goes on (``continuing``),
    its training log, so that the log and the curves of the next delta hold the whole run. Nothing already in
    ``checkpoints`` is replaced."""
    checkpoints.mkdir(parents=True, exist_ok=True)
    pairs = [(TEACHER_SAMPLES, TEACHER_SAMPLES)] + ([("training_log.jsonl", "log.jsonl")] if continuing else [])
    for source, target in pairs:
        if (init / source).exists() and not (checkpoints / target).exists():
            shutil.copyfile(init / source, checkpoints / target)


def _start_from(init: Path, cfg: DistillConfig) -> tuple[dict | None, dict | None]:
    """``(start, origin)`` for :func:`hybridmodel.distill.distill` from the delta ``init``: its run continued (the
    same config) or a later phase begun from it (``cfg.phase`` above the delta's); any other config is refused."""
    import hashlib

    from hybridmodel import hybrid_delta
    from pretrained.catalog import MIXERS_FILE

    training = hybrid_delta.manifest(init)["training"]
    theirs = DistillConfig.from_dict(training.get("config") or {})
    if theirs == cfg:
        return training, None
    if cfg.phase > theirs.phase:
        digest = hashlib.sha256()
        with open(init / MIXERS_FILE, "rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                digest.update(block)
        log = init / "training_log.jsonl"
        return None, {"delta": str(init), "sha256": digest.hexdigest(), "record": training,
                      "log": str(log) if log.exists() else None}
    raise UsageError(f"--init-from {init} was trained with {training.get('config')} (phase {theirs.phase}); this run "
                     f"is {asdict(cfg)} (phase {cfg.phase}): give its settings to continue it, or a later --phase to "
                     "begin a new phase from it")


DISTILL = Command("distill", "distil a pretrained Llama-architecture teacher (SmolLM2-135M-Instruct) into a Qwen3.5 "
                             "GDN hybrid: attention transfer, then end-to-end distillation (resumable, one thread)",
                  add_distill_arguments, run_distill,
                  outputs=lambda args: [Output(Path(args.checkpoints), "--checkpoints", kind_of=CHECKPOINTS)]
                  + ([Output(Path(args.out), "--out", kind_of=DISTILLED_DELTA)] if args.out else []),
                  interrupted=lambda args: kept_in(args.checkpoints, "the checkpoints written are",
                                                   "run the same command again to go on from the last one"))


def _distilled() -> list[str]:
    """The names of the catalogued distilled hybrids."""
    import pretrained

    return [name for name, c in pretrained.CHECKPOINTS.items() if isinstance(c, pretrained.DistilledCheckpoint)]


def add_ship_artifacts_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help=f"a distilled hybrid: {', '.join(_distilled())}")
    parser.add_argument("--cache", default=None, help=CACHE_HELP)


def _distilled_checkpoint(name: str):
    """The catalogued distilled hybrid ``name``; a :class:`~runtime.errors.UsageError` naming the choices."""
    import pretrained

    checkpoint = pretrained.CHECKPOINTS.get(name)
    if not isinstance(checkpoint, pretrained.DistilledCheckpoint):
        raise UsageError(f"{name!r} is not a distilled hybrid{did_you_mean(name, _distilled())}; choose "
                         f"{', '.join(_distilled())}")
    return checkpoint


def run_ship_artifacts(args: argparse.Namespace) -> None:
    import pretrained
    from hybridmodel.delta_artifacts import ship_artifacts

    ship_artifacts(_distilled_checkpoint(args.name), pretrained.cache_dir(args.cache))


SHIP_ARTIFACTS = Command("ship-artifacts", "copy the GateSight estimator and calibration of a rebuilt distilled "
                                           "hybrid into its delta (models/<name>/), so that every rebuild carries "
                                           "them", add_ship_artifacts_arguments, run_ship_artifacts,
                         outputs=lambda args: [Output(_distilled_checkpoint(args.name).delta_dir,
                                                      f"the delta of {args.name}", kind_of=DISTILLED_DELTA),
                                               *cache_outputs(args.cache)])

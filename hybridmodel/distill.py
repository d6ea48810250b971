"""Distil a pretrained attention-only teacher into a Qwen3.5 GDN hybrid (:mod:`hybridmodel.from_teacher`) on a CPU:
resumable, seeded, logged.

Two stages, as in LoLCATs and Mamba-in-the-Llama:

1. **attention transfer** (``transfer_steps``): every GDN layer reads the teacher's own input to the attention layer
   it replaces and is trained to reproduce that attention's output (mean squared error over the output's mean
   square, summed over layers). Layers are independent, so one teacher forward trains all of them.
2. **end-to-end distillation** (``kd_steps``): the hybrid's next-token distribution matched to the teacher's
   (KL(teacher ‖ hybrid) per token), hybrid in bf16 autocast where the CPU computes bf16 natively (float32
   elsewhere; each record says which), teacher in float32.

Their losses: :mod:`hybridmodel.distill_losses`.

Only the token mixers train (every GDN layer and the kept attention layers); embeddings, MLPs and norms stay the
teacher's exactly, so the hybrid is stored as the mixers alone (:mod:`hybridmodel.hybrid_delta`).

Text: windows of the corpus's training sources (:data:`workloads.corpus.SOURCES`, ``train`` split), packed with the
end-of-turn token between documents; never a haystack, labelling or evaluation source. Held-out quality: the
perplexity of the hybrid and of the teacher on fixed windows of the held-out split of the same sources. The windows
of every kind: :mod:`hybridmodel.distill_windows`.

**Later phases** (:mod:`hybridmodel.distill_config`, ``phase`` ≥ 2) start from a saved delta (``origin``: its
directory, the SHA-256 of its mixers file, its step and config, recorded in every checkpoint and in the delta a
phase saves) and distil under their own config, AdamW anew: a phase's checkpoint resumes under that phase's config
only. Its log goes on from the delta's: the delta's training log (up to its step) opens the phase's ``log.jsonl``,
and the phase's records carry ``step`` = the delta's step + ``phase_step``, with ``phase`` and the window's
``kind``. Their windows mix three kinds, drawn per step from ``(seed, phase, step)``:

- plain windows (:class:`~hybridmodel.distill_windows.Windows`, as in phase 1, from a seed of their own per phase);
- copy windows (:class:`~hybridmodel.distill_windows.CopyWindows`): ``[text][span of document A][text][the same
  span][text]``, every piece from the training split; the teacher predicts the repeat by attending back, and KL to
  it there trains retrieval;
- teacher samples (:class:`~hybridmodel.distill_windows.TeacherSamples`): the teacher's own ChatML conversations
  about training-source snippets, generated once each (seeded sampling, deterministic in ``(seed, index)``) and
  cached as ``teacher_samples.jsonl`` beside the checkpoint, packed into the window;
- recall windows (:class:`hybridmodel.recall_windows.RecallWindows`): everyday facts at random depths of the
  training text, asked back in ChatML and answered, of one of ``recall_lengths`` tokens
  (:func:`~hybridmodel.distill_windows.window_length`).

Each evaluation of a phase with ``probe_windows`` also logs the **retrieval probe** (:func:`retrieval_probe`): the
hybrid's top-1 accuracy and mean NLL on the repeated spans of fixed held-out copy windows, beside the teacher's
(measured once at the phase's start). A phase begins with an evaluation of the delta on its own windows (the
record at the delta's step with ``phase_step`` 0; it replaces the delta's record of that step in
:func:`hybridmodel.distill_report.read_log`).
"""

from __future__ import annotations

import json
import math
import os
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

from runtime.errors import UsageError

from .distill_config import TEACHER_SAMPLES, DistillConfig, config_difference
from .distill_losses import kd_loss, mixer_parameters, student_precision, transfer_loss
from .distill_windows import (
    CopyWindows,
    TeacherSamples,
    Windows,
    data_seed,
    shared_seed,
    tokens_before,
    window_kind,
    window_length,
)
from .hybrid_delta import mixer_state
from .linear_regime import LinearRegimeSteps
from .recall_windows import RecallWindows
from .train import install_fast_kernel


@torch.no_grad()
def retrieval_probe(model, windows: list[tuple[torch.Tensor, tuple[int, int], tuple[int, int]]]) -> dict:
    """Top-1 accuracy and mean NLL (nats) of ``model`` on the repeated spans of copy windows
    (:class:`~hybridmodel.distill_windows.CopyWindows`): every token of a repeat but its first (which follows a
    separator, so nothing predicts it), predicted from the positions before it; pooled over windows. The teacher's
    values are the ceiling."""
    hits, nll, count = 0, 0.0, 0
    for ids, _, (start, end) in windows:
        logits = model(ids).logits.float()[0, start:end - 1]
        targets = ids[0, start + 1:end]
        hits += (logits.argmax(-1) == targets).sum().item()
        nll += F.cross_entropy(logits, targets, reduction="sum").item()
        count += targets.numel()
    return {"acc": hits / count, "nll": nll / count, "tokens": count}


@contextmanager
def output_gate_means(model):
    """Within the block, every attention layer's mean output gate (sigmoid of ``q_proj``'s gate rows, over tokens,
    heads and dimensions) over the forwards run; yields ``{layer: mean}``, filled when the block ends."""
    sums: dict[int, list[float]] = {}
    hooks = []
    for index, layer in enumerate(model.model.layers):
        attention = getattr(layer, "self_attn", None)
        if attention is None or not hasattr(attention, "q_norm"):
            continue
        d = attention.head_dim

        def record(module, args, output, index=index, d=d):
            gate = output.detach().unflatten(-1, (-1, 2 * d))[..., d:]
            total = sums.setdefault(index, [0.0, 0])
            total[0] += torch.sigmoid(gate.float()).sum().item()
            total[1] += gate.numel()

        hooks.append(attention.q_proj.register_forward_hook(record))
    means: dict[int, float] = {}
    try:
        yield means
    finally:
        for hook in hooks:
            hook.remove()
        means.update({index: total / count for index, (total, count) in sorted(sums.items())})


@torch.no_grad()
def perplexity(model, windows: list[torch.Tensor]) -> float:
    """exp of the mean next-token loss over ``windows`` (float32)."""
    total, count = 0.0, 0
    for ids in windows:
        logits = model(ids).logits.float()
        total += F.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="sum").item()
        count += ids.shape[1] - 1
    return math.exp(total / count)


def _save_atomic(state: dict, path: Path) -> None:
    partial = path.with_name(path.name + ".partial")
    torch.save(state, partial)
    os.replace(partial, path)


def _same_config(saved: dict, cfg: DistillConfig) -> bool:
    try:
        return DistillConfig.from_dict(saved) == cfg
    except (TypeError, ValueError):
        return False


def distill(teacher, tokenizer, student, cfg: DistillConfig, checkpoint_dir: Path, log=print,
            checkpoint_every_s: float = 600.0, stop_after_s: float | None = None, start: dict | None = None,
            origin: dict | None = None, transfer_layers: tuple[int, ...] | None = None) -> dict:
    """Train ``student`` (from :func:`hybridmodel.from_teacher.from_teacher`) in place; resumes from
    ``checkpoint_dir/last.pt`` if it is there (same config only). Returns the last log record.

    Parameters
    ----------
    stop_after_s : float, optional
        Checkpoint and return after this many seconds of training (a session's share of the budget).
    start : dict, optional
        Where ``student`` already is when there is no checkpoint, in this config's schedule: the ``training`` record
        of a saved delta of this config (:mod:`hybridmodel.hybrid_delta`; its step, seconds and teacher
        perplexity). AdamW starts afresh there.
    origin : dict, optional
        With no checkpoint, begin phase ``cfg.phase`` (≥ 2) on ``student`` = the delta of an earlier phase:
        ``{"delta": its directory, "sha256": its mixers file's hash, "record": its training record, "log": its
        training log or None}``. The phase counts its steps from 0 (the log's from the delta's step), measures the
        teacher on its own held-out windows, and records ``origin`` (less the log) in its checkpoints and records.
    transfer_layers : tuple of int, optional
        The GDN layers attention transfer trains (those a re-split made, :func:`hybridmodel.from_teacher.resplit`);
        None: every GDN layer. Kept in the checkpoint, which a resumed run reads it from.
    """
    if start is not None and origin is not None:
        raise ValueError("give start (continue a delta of this config) or origin (begin a phase from it), not both")
    if origin is not None and cfg.phase < 2:
        raise ValueError("a phase started from a delta (origin) is phase 2 or later: set the config's phase")
    checkpoint_dir = Path(checkpoint_dir)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    last, log_path = checkpoint_dir / "last.pt", checkpoint_dir / "log.jsonl"
    install_fast_kernel(student)
    for p in student.parameters():
        p.requires_grad_(False)
    for p in teacher.parameters():
        p.requires_grad_(False)
    teacher.eval()
    seed, shared = data_seed(cfg), shared_seed(cfg)
    train_windows = Windows(tokenizer, "train", cfg.length, seed)
    heldout = Windows(tokenizer, "heldout", cfg.length, shared + 1)
    eval_windows = [heldout(k) for k in range(cfg.eval_windows)]
    copies = CopyWindows(tokenizer, "train", cfg.length, seed) if cfg.copy_fraction else None
    probe = CopyWindows(tokenizer, "heldout", cfg.length, shared + 2) if cfg.probe_windows else None
    probe_windows = [probe(k) for k in range(cfg.probe_windows)] if probe else []
    chats = (TeacherSamples(teacher, tokenizer, "train", shared, cfg.chat_pool, cfg.chat_tokens, cfg.length,
                            checkpoint_dir / TEACHER_SAMPLES, cfg.chat_general_fraction) if cfg.chat_fraction else None)
    recalls = RecallWindows(tokenizer, train_windows, seed) if cfg.recall_fraction else None
    step, optimizer, stage, record, seconds, offset, base_tokens = 0, None, None, {}, 0.0, 0, 0
    beginning = False  # a phase begun from a delta by this call: the delta is evaluated first
    teacher_ppl, teacher_probe, resumed_optimizer = None, None, None
    if last.exists():
        state = torch.load(last, map_location="cpu", weights_only=False)
        if not _same_config(state["config"], cfg):
            raise UsageError(f"{last} was written by another distillation config "
                             f"({config_difference(state['config'], cfg)}): give another --checkpoints directory or "
                             "the same settings")
        student.load_state_dict(state["mixers"], strict=False)
        step, seconds, teacher_ppl = state["step"], state["seconds"], state["teacher_ppl"]
        teacher_probe, origin = state.get("teacher_probe"), state.get("origin")
        transfer_layers = state.get("transfer_layers")
        offset, base_tokens = state.get("offset", 0), state.get("base_tokens", 0)
        if state["stage"] == cfg.stage(step):  # a stage that goes on keeps its AdamW moments
            resumed_optimizer = state["optimizer"]
        where = f" of phase {cfg.phase} (started from {origin['delta']} at step {offset})" if origin else ""
        log(f"resumed at step {step}{where} ({seconds / 3600:.2f} h of training so far)")
    elif start is not None:
        step = start.get("phase_step", start["step"])
        offset, seconds, teacher_ppl = start["step"] - step, start["train_seconds"], start["teacher_ppl"]
        teacher_probe, origin = start.get("teacher_probe"), start.get("origin")
        base_tokens = start["tokens"] - tokens_before(cfg, step) if "tokens" in start else 0
        log(f"continuing a saved delta at step {start['step']} ({seconds / 3600:.2f} h of training so far; "
            "AdamW anew)")
    elif origin is not None:
        begun = origin["record"]
        offset, seconds, base_tokens = begun["step"], begun.get("train_seconds", 0.0), begun.get("tokens", 0)
        if origin.get("log") and Path(origin["log"]).exists() and not log_path.exists():
            with open(log_path, "w") as file:  # the phase's log opens with the delta's history up to its step
                for line in Path(origin["log"]).read_text().splitlines():
                    if line.strip() and json.loads(line)["step"] <= offset:
                        file.write(line + "\n")
        origin, beginning = {key: value for key, value in origin.items() if key != "log"}, True
        log(f"phase {cfg.phase} begins from {origin['delta']} (mixers SHA-256 {origin['sha256'][:12]}…, step "
            f"{offset}, phase {DistillConfig.from_dict(begun['config']).phase}); AdamW anew")
    if teacher_ppl is None:
        teacher_ppl = perplexity(teacher, eval_windows)
        log(f"teacher held-out perplexity {teacher_ppl:.3f} ({cfg.eval_windows} windows of {cfg.length} tokens)")
    if probe_windows and teacher_probe is None:
        teacher_probe = retrieval_probe(teacher, probe_windows)
        log(f"teacher retrieval probe: accuracy {teacher_probe['acc']:.3f}, NLL {teacher_probe['nll']:.3f} on "
            f"{teacher_probe['tokens']} repeated tokens of {cfg.probe_windows} held-out copy windows")
    started, saved = time.monotonic(), time.monotonic()

    def describe(phase_step: int) -> dict:
        out = {"step": offset + phase_step}
        if cfg.phase > 1:
            out.update(phase=cfg.phase, phase_step=phase_step)
        return out

    def extras() -> dict:
        out = {"teacher_ppl": round(teacher_ppl, 3), "precision": student_precision()}
        if teacher_probe is not None:
            out.update(teacher_probe_acc=round(teacher_probe["acc"], 4),
                       teacher_probe_nll=round(teacher_probe["nll"], 4))
        if chats is not None:
            out.update(chat_pool_done=len(chats.samples), generation_seconds=round(chats.seconds, 1))
        return out

    def evaluate(record: dict) -> None:
        student.eval()
        with output_gate_means(student) as gates:
            ppl = perplexity(student, eval_windows)
        record.update(heldout_ppl=round(ppl, 3), ppl_ratio=round(ppl / teacher_ppl, 3),
                      gate_means={str(layer): round(mean, 4) for layer, mean in gates.items()})
        if probe_windows:
            got = retrieval_probe(student, probe_windows)
            record.update(probe_acc=round(got["acc"], 4), probe_nll=round(got["nll"], 4))

    def write(record: dict) -> None:
        shown = {key: value for key, value in record.items() if key not in ("config", "origin")}
        with open(log_path, "a") as file:
            file.write(json.dumps(shown) + "\n")
        log(json.dumps(shown))

    record = {**describe(step), "train_seconds": round(seconds, 1), "tokens": base_tokens + tokens_before(cfg, step),
              **extras(), "config": asdict(cfg), **({"origin": origin} if origin else {})}
    if beginning:  # the phase's starting point on its own windows (logged at the delta's step, phase_step 0)
        evaluate(record)
        write(record)

    def out_of_time() -> bool:
        return stop_after_s is not None and time.monotonic() - started >= stop_after_s

    regime = LinearRegimeSteps(student)  # q/k rows of attention layers converted into their norms' linear regime
    while step < cfg.steps and not out_of_time():
        if cfg.stage(step) != stage:
            stage = cfg.stage(step)
            params = mixer_parameters(student, stage, transfer_layers)
            for p in student.parameters():
                p.requires_grad_(False)
            for p in params.values():
                p.requires_grad_(True)
            optimizer = torch.optim.AdamW(list(params.values()), lr=cfg.learning_rate(step), betas=(0.9, 0.95),
                                          weight_decay=0.0)
            if resumed_optimizer is not None:
                optimizer.load_state_dict(resumed_optimizer)
                resumed_optimizer = None
        for group in optimizer.param_groups:
            group["lr"] = cfg.learning_rate(step)
        tick = time.monotonic()
        student.train()
        kind = window_kind(cfg, step)
        if kind == "recall":
            ids = recalls(step, window_length(cfg, step)).ids
        else:
            ids = copies(step)[0] if kind == "copy" else chats(step) if kind == "chat" else train_windows(step)
        loss = (transfer_loss(student, teacher, ids, transfer_layers) if stage == "transfer"
                else kd_loss(student, teacher, ids))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        regime.scale_gradients()
        torch.nn.utils.clip_grad_norm_([p for group in optimizer.param_groups for p in group["params"]], 1.0)
        regime.step(optimizer)
        step += 1
        seconds += time.monotonic() - tick
        record = {**describe(step), "stage": stage, **({"kind": kind} if cfg.phase > 1 else {}),
                  "loss": round(loss.item(), 5), "lr": cfg.learning_rate(step - 1),
                  "tokens": base_tokens + tokens_before(cfg, step), "train_seconds": round(seconds, 1), **extras(),
                  "config": asdict(cfg), **({"origin": origin} if origin else {})}
        if step % cfg.eval_every == 0 or step == cfg.steps:
            evaluate(record)
        write(record)
        if time.monotonic() - saved >= checkpoint_every_s or step == cfg.steps or out_of_time():
            _save_atomic({"config": asdict(cfg), "step": step, "seconds": seconds, "teacher_ppl": teacher_ppl,
                          "teacher_probe": teacher_probe, "origin": origin, "offset": offset,
                          "base_tokens": base_tokens, "stage": stage, "optimizer": optimizer.state_dict(),
                          "transfer_layers": transfer_layers,
                          "mixers": {name: p.detach().clone() for name, p in mixer_state(student).items()}}, last)
            saved = time.monotonic()
    if step < cfg.steps:
        log(f"stopped at step {step} of {cfg.steps}; run the same command again to resume")
    regime.remove()
    student.eval()
    return record

"""Distil a pretrained attention-only teacher into a Qwen3.5 GDN hybrid (:mod:`hybridmodel.from_teacher`) on a CPU:
resumable, seeded, logged.

Two stages, as in LoLCATs and Mamba-in-the-Llama:

1. **attention transfer** (``transfer_steps``): every GDN layer reads the teacher's own input to the attention layer
   it replaces and is trained to reproduce that attention's output (mean squared error over the output's mean
   square, summed over layers). Layers are independent, so one teacher forward trains all of them.
2. **end-to-end distillation** (``kd_steps``): the hybrid's next-token distribution matched to the teacher's
   (KL(teacher ‖ hybrid) per token), hybrid in bf16 autocast, teacher in float32.

Only the token mixers train (every GDN layer and the kept attention layers); embeddings, MLPs and norms stay the
teacher's exactly, so the hybrid is stored as the mixers alone (:mod:`hybridmodel.hybrid_delta`).

Text: windows of the corpus's training sources (:data:`workloads.corpus.SOURCES`, ``train`` split), packed with the
end-of-turn token between documents; never a haystack, labelling or evaluation source. Held-out quality: the
perplexity of the hybrid and of the teacher on fixed windows of the held-out split of the same sources.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

from workloads.corpus import SOURCES, documents

from .distill_config import DistillConfig
from .hybrid_delta import MIXERS, mixer_state
from .train import install_fast_kernel


def _token_documents(tokenizer, split: str) -> list[list[int]]:
    return [tokenizer(text, add_special_tokens=False)["input_ids"]
            for source in SOURCES for _, text in documents(source, split)]


class Windows:
    """Windows of ``length`` tokens from the documents of one split, packed with ``separator`` between documents;
    the window of step ``k`` depends on ``(seed, k)`` only, so a resumed run reads what an unbroken one would."""

    def __init__(self, tokenizer, split: str, length: int, seed: int):
        self.docs = [doc for doc in _token_documents(tokenizer, split) if len(doc) >= 64]
        if not self.docs:
            raise ValueError(f"no documents of {', '.join(SOURCES)} ({split} split) on this machine")
        self.length, self.seed, self.separator = length, seed, tokenizer.eos_token_id

    def __call__(self, step: int) -> torch.Tensor:
        rng = random.Random(self.seed * 1_000_003 + step)
        doc = rng.choice(self.docs)
        start = rng.randrange(max(1, len(doc) - self.length))
        ids = doc[start:start + self.length]
        while len(ids) < self.length:
            ids = ids + [self.separator] + rng.choice(self.docs)
        return torch.tensor(ids[:self.length]).unsqueeze(0)


def mixer_parameters(model, stage: str) -> dict[str, torch.nn.Parameter]:
    """``{name: parameter}`` trained in ``stage``: the GDN layers in attention transfer, every mixer after."""
    return mixer_state(model, (".linear_attn.",) if stage == "transfer" else MIXERS)


def transfer_loss(student, teacher, ids: torch.Tensor) -> torch.Tensor:
    """Σ over GDN layers of ‖GDN(x) − attention(x)‖² / ‖attention(x)‖², x the teacher's own input to that layer."""
    pairs, hooks = {}, []
    gdn = {index: layer.linear_attn for index, layer in enumerate(student.model.layers)
           if hasattr(layer, "linear_attn")}
    for index in gdn:
        def record(module, args, kwargs, output, index=index):
            pairs[index] = (kwargs["hidden_states"] if "hidden_states" in kwargs else args[0], output[0])
        hooks.append(teacher.model.layers[index].self_attn.register_forward_hook(record, with_kwargs=True))
    try:
        with torch.no_grad():
            teacher(ids)
    finally:
        for hook in hooks:
            hook.remove()
    total = 0.0
    for index, module in gdn.items():
        x, target = pairs[index]
        out = module(x)
        total = total + (out - target).pow(2).mean() / target.pow(2).mean()
    return total


def kd_loss(student, teacher, ids: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of KL(teacher ‖ student) of the next-token distributions."""
    with torch.no_grad():
        target = F.log_softmax(teacher(ids).logits.float(), dim=-1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = student(ids).logits
    log_q = F.log_softmax(logits.float(), dim=-1)
    return (target.exp() * (target - log_q)).sum(-1).mean()


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


def distill(teacher, tokenizer, student, cfg: DistillConfig, checkpoint_dir: Path, log=print,
            checkpoint_every_s: float = 600.0, stop_after_s: float | None = None, start: dict | None = None) -> dict:
    """Train ``student`` (from :func:`hybridmodel.from_teacher.from_teacher`) in place; resumes from
    ``checkpoint_dir/last.pt`` if it is there (same config only). Returns the last log record.

    Parameters
    ----------
    stop_after_s : float, optional
        Checkpoint and return after this many seconds of training (a session's share of the budget).
    start : dict, optional
        Where ``student`` already is when there is no checkpoint: the ``training`` record of a saved delta
        (:mod:`hybridmodel.hybrid_delta`; its step, seconds and teacher perplexity). AdamW starts afresh there.
    """
    checkpoint_dir = Path(checkpoint_dir)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    last, log_path = checkpoint_dir / "last.pt", checkpoint_dir / "log.jsonl"
    install_fast_kernel(student)
    for p in student.parameters():
        p.requires_grad_(False)
    for p in teacher.parameters():
        p.requires_grad_(False)
    teacher.eval()
    train_windows = Windows(tokenizer, "train", cfg.length, cfg.seed)
    heldout = Windows(tokenizer, "heldout", cfg.length, cfg.seed + 1)
    eval_windows = [heldout(k) for k in range(cfg.eval_windows)]
    step, optimizer, stage, record, seconds = 0, None, None, {}, 0.0
    teacher_ppl, resumed_optimizer = None, None
    if last.exists():
        state = torch.load(last, map_location="cpu", weights_only=False)
        if state["config"] != asdict(cfg):
            raise ValueError(f"{last} was written by another distillation config ({state['config']}); this run's is "
                             f"{asdict(cfg)}: give another --checkpoints directory or the same settings")
        student.load_state_dict(state["mixers"], strict=False)
        step, seconds, teacher_ppl = state["step"], state["seconds"], state["teacher_ppl"]
        if state["stage"] == cfg.stage(step):  # a stage that goes on keeps its AdamW moments
            resumed_optimizer = state["optimizer"]
        log(f"resumed at step {step} ({seconds / 3600:.2f} h of training so far)")
    elif start is not None:
        step, seconds, teacher_ppl = start["step"], start["train_seconds"], start["teacher_ppl"]
        log(f"continuing a saved delta at step {step} ({seconds / 3600:.2f} h of training so far; AdamW anew)")
    if teacher_ppl is None:
        teacher_ppl = perplexity(teacher, eval_windows)
        log(f"teacher held-out perplexity {teacher_ppl:.3f} ({cfg.eval_windows} windows of {cfg.length} tokens)")
    started, saved = time.monotonic(), time.monotonic()
    record = {"step": step, "train_seconds": round(seconds, 1), "tokens": step * cfg.length,
              "teacher_ppl": round(teacher_ppl, 3), "config": asdict(cfg)}

    def out_of_time() -> bool:
        return stop_after_s is not None and time.monotonic() - started >= stop_after_s

    while step < cfg.steps and not out_of_time():
        if cfg.stage(step) != stage:
            stage = cfg.stage(step)
            params = mixer_parameters(student, stage)
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
        ids = train_windows(step)
        loss = transfer_loss(student, teacher, ids) if stage == "transfer" else kd_loss(student, teacher, ids)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for group in optimizer.param_groups for p in group["params"]], 1.0)
        optimizer.step()
        step += 1
        seconds += time.monotonic() - tick
        record = {"step": step, "stage": stage, "loss": round(loss.item(), 5), "lr": cfg.learning_rate(step - 1),
                  "tokens": step * cfg.length, "train_seconds": round(seconds, 1),
                  "teacher_ppl": round(teacher_ppl, 3), "config": asdict(cfg)}
        if step % cfg.eval_every == 0 or step == cfg.steps:
            student.eval()
            ppl = perplexity(student, eval_windows)
            record.update(heldout_ppl=round(ppl, 3), ppl_ratio=round(ppl / teacher_ppl, 3))
        shown = {key: value for key, value in record.items() if key != "config"}
        with open(log_path, "a") as file:
            file.write(json.dumps(shown) + "\n")
        log(json.dumps(shown))
        if time.monotonic() - saved >= checkpoint_every_s or step == cfg.steps or out_of_time():
            _save_atomic({"config": asdict(cfg), "step": step, "seconds": seconds, "teacher_ppl": teacher_ppl,
                          "stage": stage, "optimizer": optimizer.state_dict(),
                          "mixers": {name: p.detach().clone() for name, p in mixer_state(student).items()}}, last)
            saved = time.monotonic()
    if step < cfg.steps:
        log(f"stopped at step {step} of {cfg.steps}; run the same command again to resume")
    student.eval()
    return record

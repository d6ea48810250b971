"""Train the default model from scratch: seeded, resumable, short-to-long curriculum (``bench train-model``)."""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median

import torch
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

from artifacts.files import backup_path
from pretrained.file_record import write_record
from runtime.errors import UsageError
from runtime.gdn import transformers_chunk_kernel

from .data import batch
from .half_lives import static_half_lives
from .tokenizer import build_tokenizer


@dataclass(frozen=True)
class Stage:
    """One step of the curriculum (:data:`CURRICULUM`), in force from its ``start`` to the next stage's.

    Attributes
    ----------
    start : int
        The first step of the stage.
    batch, length : int
        Rows per step and tokens per row.
    mix : dict
        ``{kind of row: share}``, the kinds of :func:`hybridmodel.data.batch`.
    bf16 : bool
        bfloat16 autocast (with ``--dtype auto``).
    """

    start: int
    batch: int
    length: int
    mix: dict
    bf16: bool


PHASE2_MIX = {"needles": 0.35, "chains": 0.15, "task": 0.3, "quiz": 0.05, "mqar": 0.05, "text": 0.1}
# Retrieval first, in its plainest and densest form (multi-query associative recall, float32: the recipe measured
# to make it emerge on this CPU), then the same skill in the task templates at growing lengths. A first attempt
# that started with ~5 verbose questions per 512-token row stayed at chance for 475 steps. With the GDN decay
# initialisation (slow heads exist from step 0) retrieval emerged later on MQAR (loss 1.08 against 0.62 at step
# 250), so the MQAR stage is 400 steps instead of the earlier recipe's 300.
CURRICULUM = (
    Stage(0, 32, 128, {"mqar": 1.0}, bf16=False),
    Stage(400, 16, 256, {"mqar": 0.4, "quiz": 0.4, "recall": 0.2}, bf16=False),
    Stage(550, 8, 512, {"mqar": 0.1, "quiz": 0.3, "recall": 0.2, "task": 0.3, "text": 0.1}, bf16=True),
    Stage(700, 4, 1024, {"mqar": 0.1, "quiz": 0.2, "recall": 0.1, "task": 0.5, "text": 0.1}, bf16=True),
    Stage(850, 2, 2048, {"mqar": 0.1, "quiz": 0.2, "recall": 0.1, "task": 0.5, "text": 0.1}, bf16=True),
    # Second phase (learning-rate restart): the first phase's model copied 4-digit numbers only (uuids came out as
    # their digits, multi-value keys as one value) and lost track among the ~55 needles of 2K multikey_2. Dense
    # drills of every NIAH variant and of variable tracking, from 1K to 4K tokens.
    Stage(950, 4, 1024, PHASE2_MIX, bf16=True),
    Stage(1200, 2, 2048, PHASE2_MIX, bf16=True),
    Stage(1500, 1, 4096, PHASE2_MIX, bf16=True),
)

# Decay initialisation of every GDN head, as in Mamba2 (``mamba_ssm/modules/mamba2.py``: A_init_range=(1, 16),
# dt_min=0.001, dt_max=0.1, dt_init_floor=1e-4) and Gated DeltaNet (``fla/layers/gated_deltanet.py``, same dt):
# dt log-uniform in [0.001, 0.1], dt_bias = softplus⁻¹(dt), A uniform in [1, 16], A_log = log A. The per-token
# decay at a = 0 is exp(−A·dt), i.e. half-lives ln 2 / (A·dt) from ~0.4 to ~700 tokens (median ~8). transformers'
# own initialisation (dt_bias = 1, A ~ U(0, 16)) gives 0.03–2 tokens, and training does not move them. A draw
# stratified per layer (every layer given one head from each quarter of the dt range) was tried: MQAR loss stalled
# at 1.94 by step 375 (chance 2.30), so the draws are i.i.d. as in the recipe.
GDN_DT_RANGE = (0.001, 0.1)
GDN_DT_FLOOR = 1e-4
GDN_A_RANGE = (1.0, 16.0)


@dataclass
class TrainConfig:
    """The training run's schedule and seed (the data of each step depends on ``seed`` and the step only).

    Attributes
    ----------
    steps : int
        Total steps, ≥ 1.
    phases : tuple[tuple[int, float], ...]
        ``(first step, peak learning rate)`` of each cosine cycle.
    warmup : int
        Linear warm-up steps at the start of each cycle.
    weight_decay : float
        AdamW's, on matrices only (:func:`parameter_groups`).
    seed : int
    checkpoint_every : int
        Steps between checkpoints (a killed run resumes from the last).
    """

    steps: int = 1750
    phases: tuple[tuple[int, float], ...] = ((0, 1e-3), (950, 5e-4))
    warmup: int = 50
    weight_decay: float = 0.01
    seed: int = 0
    checkpoint_every: int = 25

    def __post_init__(self):
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise UsageError(f"steps={self.steps!r}: expected an integer >= 1 (total training steps)")


def model_config(vocab_size: int) -> Qwen3_5TextConfig:
    """12 layers, GDN:attention = 3:1, GQA 4/2 heads of 32, partial RoPE 0.25, sigmoid output gate."""
    return Qwen3_5TextConfig(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=384, num_hidden_layers=12,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_conv_kernel_dim=4, full_attention_interval=4, max_position_embeddings=32768,
        tie_word_embeddings=True, pad_token_id=259, eos_token_id=257, bos_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True},
    )


def init_gdn_decay(model, generator: torch.Generator) -> None:
    """Re-initialise ``A_log`` and ``dt_bias`` of every GDN layer with the ranges above (``GDN_*``)."""
    lo, hi = (math.log(x) for x in GDN_DT_RANGE)
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer, "linear_attn"):
                module = layer.linear_attn
                heads = module.dt_bias.numel()
                dt = torch.exp(lo + (hi - lo) * torch.rand(heads, generator=generator)).clamp(min=GDN_DT_FLOOR)
                module.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
                a = GDN_A_RANGE[0] + (GDN_A_RANGE[1] - GDN_A_RANGE[0]) * torch.rand(heads, generator=generator)
                module.A_log.copy_(torch.log(a))


def parameter_groups(model, weight_decay: float) -> list[dict]:
    """AdamW groups: matrices decay; vectors (GDN ``A_log`` / ``dt_bias``, norm weights, biases) do not — decay
    would pull the decay rates towards exp(0) · softplus(0) and erase the slow heads."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    keep = [p for p in model.parameters() if p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]


def new_model(vocab_size: int, seed: int) -> Qwen3_5ForCausalLM:
    """The default model's architecture, freshly initialised (GDN decay by ``init_gdn_decay``), seeded."""
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(model_config(vocab_size))
    init_gdn_decay(model, torch.Generator().manual_seed(seed))
    return model


def install_fast_kernel(model) -> None:
    """Use the exact triangular-solve GDN kernel on this model instance only."""
    for layer in model.model.layers:
        if hasattr(layer, "linear_attn"):
            layer.linear_attn.chunk_gated_delta_rule = transformers_chunk_kernel


def row_mean_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean over rows of each row's mean token loss: a text row (every token labelled) weighs as much as a task
    row (a few answer tokens), instead of drowning the answers.

    Parameters
    ----------
    logits : torch.Tensor
        ``[B, L, V]``.
    labels : torch.Tensor
        ``[B, L]`` targets, -100 where there is none; rows without any are left out.

    Returns
    -------
    torch.Tensor
        ``[]`` float32.
    """
    per_token = torch.nn.functional.cross_entropy(
        logits.float().transpose(1, 2), labels, ignore_index=-100, reduction="none"
    )
    counts = (labels != -100).sum(1)
    rows = counts > 0
    return (per_token.sum(1)[rows] / counts[rows]).mean()


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up then cosine decay to 5 % of the peak, within the phase that ``step`` belongs to."""
    starts = [start for start, _ in cfg.phases] + [cfg.steps]
    k = max(i for i, start in enumerate(starts[:-1]) if start <= step)
    (start, peak), length = cfg.phases[k], starts[k + 1] - starts[k]
    local = step - start
    lr = peak * min(1.0, (local + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * local / length))
    return max(lr, peak * 0.05)


def _stage(step: int) -> Stage:
    return [s for s in CURRICULUM if s.start <= step][-1]


EXISTING = ("refuse", "resume", "replace")
"""What :func:`train` may do to a trained model already in its output directory: nothing (the default), or, when
told, continue its checkpoint (``resume``) or train anew (``replace``); both then move the old directory aside."""


def check_target(out_dir: Path, checkpoint_dir: Path, existing: str = "refuse") -> None:
    """``ValueError`` before any work if :func:`train` would write over a trained model (a ``model.safetensors``
    in ``out_dir``) without being told to, or is told to resume without a checkpoint."""
    if existing not in EXISTING:
        raise UsageError(f"unknown existing={existing!r}; choose {', '.join(EXISTING)}")
    checkpoint = Path(checkpoint_dir) / "last.pt"
    if existing == "resume" and not checkpoint.exists():
        raise UsageError(f"--resume: no checkpoint at {checkpoint} to continue from; pass the run's --checkpoints")
    if existing == "refuse" and (Path(out_dir) / "model.safetensors").exists():
        # --resume only where it would work: a checkpoint to continue from
        resume = (f"pass --resume to continue training it from {checkpoint}, or " if checkpoint.exists() else
                  f"--checkpoints {checkpoint_dir} holds no checkpoint to continue it from (last.pt); pass ")
        raise UsageError(f"{out_dir} holds a trained model (model.safetensors); {resume}--replace to train anew "
                         "(either way the old directory, its gatesight/ and calibration/ included, is moved aside "
                         "to a timestamped backup first), or write to another --out")


def train(out_dir: Path, checkpoint_dir: Path, cfg: TrainConfig = TrainConfig(), log=print,
          device: str = "cpu", precision: str = "auto", existing: str = "refuse") -> Path:
    """Train (or resume) the default model; ``precision``: ``auto`` (each stage's own: bf16 autocast from the
    512-token stage on), ``float32`` or ``bfloat16`` (autocast on every stage). ``existing``: what to do with a
    trained model already in ``out_dir`` (:data:`EXISTING`; :func:`check_target`)."""
    if precision not in ("auto", "float32", "bfloat16"):
        raise UsageError(f"unknown training precision {precision!r}; choose auto, float32 or bfloat16")
    check_target(out_dir, checkpoint_dir, existing)
    device = torch.device(device)
    tokenizer = build_tokenizer()
    model = new_model(len(tokenizer), cfg.seed).to(device)
    install_fast_kernel(model)
    optimizer = torch.optim.AdamW(parameter_groups(model, cfg.weight_decay), lr=cfg.phases[0][1], betas=(0.9, 0.95))
    start, elapsed, tokens_seen = 0, 0.0, 0
    checkpoint = checkpoint_dir / "last.pt"
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start, elapsed, tokens_seen = state["step"], state["elapsed"], state["tokens"]
        log(f"resumed from step {start}")
    model.train()
    for step in range(start, cfg.steps):
        rng = random.Random(f"{cfg.seed}/{step}")  # data depends on the step only, so a resume replays exactly
        stage = _stage(step)
        ids, labels = batch(tokenizer, rng, stage.batch, stage.length, stage.mix)
        ids, labels = ids.to(device), labels.to(device)
        bf16 = stage.bf16 if precision == "auto" else precision == "bfloat16"
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, cfg)
        t0 = time.time()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(ids).logits
        loss = row_mean_loss(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        elapsed += time.time() - t0
        tokens_seen += ids.numel()
        log(json.dumps({"step": step + 1, "loss": round(loss.item(), 4), "len": stage.length,
                        "tok_s": round(ids.numel() / (time.time() - t0)), "elapsed_s": round(elapsed)}))
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
            lives = sorted(static_half_lives(model).values())
            log(json.dumps({"step": step + 1, "static_half_life_median": round(median(lives), 2),
                            "heads_over_64_tokens": sum(h >= 64 for h in lives), "heads": len(lives)}))
            checkpoint_dir.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1,
                        "elapsed": elapsed, "tokens": tokens_seen}, checkpoint.with_suffix(".tmp"))
            checkpoint.with_suffix(".tmp").replace(checkpoint)
    save(model, tokenizer, out_dir, {"train": asdict(cfg), "steps_done": cfg.steps, "train_seconds": round(elapsed),
                                     "tokens": tokens_seen, "curriculum": [asdict(s) for s in CURRICULUM]}, log)
    return out_dir


def save(model, tokenizer, out_dir: Path, record: dict, log=print) -> None:
    """Write the model into a fresh directory beside ``out_dir``, then move it into place; an old directory there
    is first moved aside to :func:`artifacts.files.backup_path` (its artifacts were derived from the old weights)."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    partial = out_dir.with_name(f"{out_dir.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)  # left by a save that was killed
    model.eval()
    model.save_pretrained(partial, safe_serialization=True)
    tokenizer.save_pretrained(partial)
    (partial / "training.json").write_text(json.dumps(record, indent=2))
    write_record(partial)  # its files as written: a model changed in place later is never run under its name
    if out_dir.exists():
        backup = backup_path(out_dir)
        out_dir.rename(backup)
        log(f"moved the previous {out_dir} (with its gatesight/ and calibration/) to {backup}")
    partial.rename(out_dir)

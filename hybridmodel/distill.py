"""Distil a pretrained attention-only teacher into a Qwen3.5 GDN hybrid (:mod:`hybridmodel.from_teacher`) on a CPU:
resumable, seeded, logged.

Two stages, as in LoLCATs and Mamba-in-the-Llama:

1. **attention transfer** (``transfer_steps``): every GDN layer reads the teacher's own input to the attention layer
   it replaces and is trained to reproduce that attention's output (mean squared error over the output's mean
   square, summed over layers). Layers are independent, so one teacher forward trains all of them.
2. **end-to-end distillation** (``kd_steps``): the hybrid's next-token distribution matched to the teacher's
   (KL(teacher ‖ hybrid) per token), hybrid in bf16 autocast where the CPU computes bf16 natively (float32
   elsewhere; each record says which), teacher in float32.

Only the token mixers train (every GDN layer and the kept attention layers); embeddings, MLPs and norms stay the
teacher's exactly, so the hybrid is stored as the mixers alone (:mod:`hybridmodel.hybrid_delta`).

Text: windows of the corpus's training sources (:data:`workloads.corpus.SOURCES`, ``train`` split), packed with the
end-of-turn token between documents; never a haystack, labelling or evaluation source. Held-out quality: the
perplexity of the hybrid and of the teacher on fixed windows of the held-out split of the same sources.

**Later phases** (:mod:`hybridmodel.distill_config`, ``phase`` ≥ 2) start from a saved delta (``origin``: its
directory, the SHA-256 of its mixers file, its step and config, recorded in every checkpoint and in the delta a
phase saves) and distil under their own config, AdamW anew: a phase's checkpoint resumes under that phase's config
only. Its log goes on from the delta's: the delta's training log (up to its step) opens the phase's ``log.jsonl``,
and the phase's records carry ``step`` = the delta's step + ``phase_step``, with ``phase`` and the window's
``kind``. Their windows mix three kinds, drawn per step from ``(seed, phase, step)``:

- plain windows (:class:`Windows`, as in phase 1, from a seed of their own per phase);
- copy windows (:class:`CopyWindows`): ``[text][span of document A][text][the same span][text]``, every piece from
  the training split; the teacher predicts the repeat by attending back, and KL to it there trains retrieval;
- teacher samples (:class:`TeacherSamples`): the teacher's own ChatML conversations about training-source
  snippets, generated once each (seeded sampling, deterministic in ``(seed, index)``) and cached as
  ``teacher_samples.jsonl`` beside the checkpoint, packed into the window;
- recall windows (:class:`hybridmodel.recall_windows.RecallWindows`): everyday facts at random depths of the
  training text, asked back in ChatML and answered, of one of ``recall_lengths`` tokens (:func:`window_length`).

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
import random
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

from runtime.errors import UsageError
from workloads.corpus import SOURCES, documents

from .distill_config import TEACHER_SAMPLES, DistillConfig, config_difference
from .hybrid_delta import MIXERS, mixer_state
from .linear_regime import LinearRegimeSteps
from .recall_windows import RecallWindows, vocabulary
from .train import install_fast_kernel


def _token_documents(tokenizer, split: str) -> list[list[int]]:
    return [tokenizer(text, add_special_tokens=False)["input_ids"]
            for source in SOURCES for _, text in documents(source, split)]


class Windows:
    """Windows of ``length`` tokens from the documents of one split (``split``; ``docs`` their token ids), packed
    with ``separator`` between documents; the window of step ``k`` depends on ``(seed, k)`` only, so a resumed run
    reads what an unbroken one would."""

    def __init__(self, tokenizer, split: str, length: int, seed: int):
        self.docs = [doc for doc in _token_documents(tokenizer, split) if len(doc) >= 64]
        if not self.docs:
            raise UsageError(f"no documents of {', '.join(SOURCES)} ({split} split) on this machine")
        self.split, self.length, self.seed, self.separator = split, length, seed, tokenizer.eos_token_id

    def __call__(self, step: int) -> torch.Tensor:
        rng = random.Random(self.seed * 1_000_003 + step)
        doc = rng.choice(self.docs)
        start = rng.randrange(max(1, len(doc) - self.length))
        ids = doc[start:start + self.length]
        while len(ids) < self.length:
            ids = ids + [self.separator] + rng.choice(self.docs)
        return torch.tensor(ids[:self.length]).unsqueeze(0)


class CopyWindows:
    """Windows of ``length`` tokens in which a span recurs: ``[text] sep [A] sep [text] sep [A] sep [text]``, ``A`` a
    span of ``span`` tokens (drawn in ``[span_min, span_max]``) of one document, the texts packed from the others,
    the distance between the two copies and the place of the first drawn too; everything from the documents of one
    split of the training sources, and deterministic in ``(seed, step)``.

    Calling returns ``(ids [1, length], first, repeat)``, ``first`` and ``repeat`` the ``(start, end)`` positions of
    the two copies of ``A`` (``ids[0, start:end]`` equal)."""

    def __init__(self, tokenizer, split: str, length: int, seed: int, span_min: int = 32, span_max: int = 256):
        self.plain = Windows(tokenizer, split, length, seed)
        self.length, self.seed, self.separator = length, seed, tokenizer.eos_token_id
        self.span_max = max(2, min(span_max, (length - 4) // 4))
        self.span_min = max(2, min(span_min, self.span_max))

    def _text(self, rng: random.Random, count: int) -> list[int]:
        ids: list[int] = []
        while len(ids) < count:
            doc = rng.choice(self.plain.docs)
            start = rng.randrange(max(1, len(doc) - count))
            ids = ids + ([self.separator] if ids else []) + doc[start:start + count - len(ids)]
        return ids[:count]

    def __call__(self, step: int) -> tuple[torch.Tensor, tuple[int, int], tuple[int, int]]:
        rng = random.Random(f"copy:{self.seed}:{step}")
        span = rng.randint(self.span_min, self.span_max)
        doc = rng.choice([d for d in self.plain.docs if len(d) >= span] or self.plain.docs)
        offset = rng.randrange(max(1, len(doc) - span + 1))
        piece = doc[offset:offset + span]
        span = len(piece)
        rest = self.length - 2 * span - 4
        gap = rng.randint(0, rest)  # the text between the copies: their distance
        before = rng.randint(0, rest - gap)
        text = self._text(rng, rest)
        sep = [self.separator]
        ids = (text[:before] + sep + piece + sep + text[before:before + gap] + sep + piece + sep
               + text[before + gap:])
        first = (before + 1, before + 1 + span)
        repeat = (first[1] + 1 + gap + 1, first[1] + 1 + gap + 1 + span)
        return torch.tensor(ids).unsqueeze(0), first, repeat


CHAT_INSTRUCTIONS = ("Summarise this text in two or three sentences.", "Explain what this does.",
                     "What does this code or text do?", "Continue this text.", "What is this about?")
"""The user turns of the teacher samples: one of these over a training-source snippet."""

GENERAL_INSTRUCTIONS = ("In two sentences, what is meant by {topic}?",
                        "Describe {topic} to someone who has never heard of it.",
                        "Give a short, friendly explanation of {topic}.",
                        "Why would a person care about {topic}? Keep it brief.",
                        "Suggest one practical tip that involves {topic}.",
                        "Write a polite two-line message to a colleague that mentions {topic}.",
                        "What do people often get wrong about {topic}?",
                        "Compare {topic} and {other} in a few words.")
"""User turns of the teacher samples that carry no snippet (``general_fraction``): a question about a word of the
training documents, so that the hybrid learns how the teacher answers a plain request — briefly, and without
repeating itself — as well as how it treats a quoted text. Their wording shares no four words with the benchmark
tasks nor with the chat check's questions (tests/model/test_distill.py)."""


class TeacherSamples:
    """The teacher's own ChatML conversations: conversation ``i`` is a user turn (one of :data:`CHAT_INSTRUCTIONS`
    over a snippet of 48-200 tokens of a training-split document, both drawn from ``(seed, i)``; or, with
    probability ``general_fraction`` drawn apart from ``(seed, i)``, one of :data:`GENERAL_INSTRUCTIONS` about
    words of the training documents) and the teacher's answer, sampled (temperature 0.7, top-p 0.9, torch seeded
    from ``(seed, i)``) up to ``max_new_tokens``.

    A conversation is generated the first time a window needs it and appended to ``cache`` (JSON lines), which a
    resumed run reads back; lines of another seed, answer length or teacher are ignored. Calling with a step packs
    conversations drawn from ``(seed, step)`` into a window of ``length`` tokens. ``seconds`` is the generation
    time spent so far (cached lines included)."""

    def __init__(self, teacher, tokenizer, split: str, seed: int, pool: int, max_new_tokens: int, length: int,
                 cache: Path | None = None, general_fraction: float = 0.0):
        self.teacher, self.tokenizer, self.seed, self.pool = teacher, tokenizer, seed, pool
        self.max_new_tokens, self.length, self.cache = max_new_tokens, length, cache
        self.docs = Windows(tokenizer, split, 64, seed).docs
        self.general_fraction = general_fraction
        self.topics = vocabulary(self.docs, tokenizer) if general_fraction else []
        c = teacher.config
        self.key = {"seed": seed, "max_new_tokens": max_new_tokens,
                    "teacher": [c.model_type, c.vocab_size, c.hidden_size, c.num_hidden_layers]}
        if general_fraction:  # a pool without general turns keeps the key its cached conversations were written with
            self.key["general_fraction"] = general_fraction
        self.samples: dict[int, dict] = {}
        if cache is not None and Path(cache).exists():
            for line in Path(cache).read_text().splitlines():
                if line.strip():
                    sample = json.loads(line)
                    if sample.get("key") == self.key:
                        self.samples[sample["index"]] = sample

    @property
    def seconds(self) -> float:
        return sum(sample["seconds"] for sample in self.samples.values())

    def message(self, index: int) -> str:
        """The user turn of conversation ``index``."""
        general = random.Random(f"chat-general:{self.seed}:{index}")
        if general.random() < self.general_fraction:
            topic, other = general.sample(self.topics, 2)
            return general.choice(GENERAL_INSTRUCTIONS).format(topic=topic, other=other)
        rng = random.Random(f"chat:{self.seed}:{index}")
        doc = rng.choice(self.docs)
        count = rng.randint(48, 200)
        start = rng.randrange(max(1, len(doc) - count))
        snippet = self.tokenizer.decode(doc[start:start + count]).strip()
        return f"{rng.choice(CHAT_INSTRUCTIONS)}\n\n{snippet}"

    def prompt(self, index: int) -> list[int]:
        message = self.message(index)
        ids = self.tokenizer.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True,
                                                 tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)

    @torch.no_grad()
    def conversation(self, index: int) -> list[int]:
        if index not in self.samples:
            tick = time.monotonic()
            prompt = torch.tensor(self.prompt(index)).unsqueeze(0)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed * 1_000_003 + index)
                out = self.teacher.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True,
                                            temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=self.max_new_tokens,
                                            eos_token_id=self.tokenizer.eos_token_id,
                                            pad_token_id=self.tokenizer.eos_token_id)
            sample = {"index": index, "key": self.key, "ids": out[0].tolist(),
                      "answer_tokens": out.shape[1] - prompt.shape[1], "seconds": round(time.monotonic() - tick, 2)}
            self.samples[index] = sample
            if self.cache is not None:
                with open(self.cache, "a") as file:
                    file.write(json.dumps(sample) + "\n")
        return self.samples[index]["ids"]

    def __call__(self, step: int) -> torch.Tensor:
        rng = random.Random(f"chat-window:{self.seed}:{step}")
        ids: list[int] = []
        while len(ids) < self.length:
            ids = ids + self.conversation(rng.randrange(self.pool))
        return torch.tensor(ids[:self.length]).unsqueeze(0)


def window_kind(cfg: DistillConfig, step: int) -> str:
    """``plain``, ``copy``, ``chat`` or ``recall``: the kind of the window of ``step`` (of the phase), from ``(seed,
    phase, step)`` and the config's shares (phase 1's defaults: always ``plain``)."""
    if not cfg.copy_fraction and not cfg.chat_fraction and not cfg.recall_fraction:
        return "plain"
    draw = random.Random(f"kind:{cfg.seed}:{cfg.phase}:{step}").random()
    for kind, share in (("copy", cfg.copy_fraction), ("chat", cfg.chat_fraction), ("recall", cfg.recall_fraction)):
        if draw < share:
            return kind
        draw -= share
    return "plain"


def window_length(cfg: DistillConfig, step: int) -> int:
    """Tokens of the window of ``step``: one of ``recall_lengths`` for a recall window (from ``(seed, phase,
    step)``), ``length`` otherwise."""
    if window_kind(cfg, step) != "recall" or not cfg.recall_lengths:
        return cfg.length
    return random.Random(f"recall-length:{cfg.seed}:{cfg.phase}:{step}").choice(cfg.recall_lengths)


def tokens_before(cfg: DistillConfig, step: int) -> int:
    """Tokens of the phase's windows before ``step``."""
    if not cfg.recall_fraction:
        return step * cfg.length
    return sum(window_length(cfg, k) for k in range(step))


def data_seed(cfg: DistillConfig) -> int:
    """The seed of a phase's training windows: phase 1 reads what it always read; each later phase reads other
    windows."""
    return cfg.seed + 1000 * (cfg.phase - 1)


def shared_seed(cfg: DistillConfig) -> int:
    """The seed of the held-out windows, the probe and the teacher's pool: phase 1's own; phase 2's for every later
    phase, so that later phases are measured on one yardstick and the pool (≈ 40 min of the teacher's generation)
    is generated once."""
    return cfg.seed if cfg.phase == 1 else cfg.seed + 1000


@torch.no_grad()
def retrieval_probe(model, windows: list[tuple[torch.Tensor, tuple[int, int], tuple[int, int]]]) -> dict:
    """Top-1 accuracy and mean NLL (nats) of ``model`` on the repeated spans of copy windows (:class:`CopyWindows`):
    every token of a repeat but its first (which follows a separator, so nothing predicts it), predicted from the
    positions before it; pooled over windows. The teacher's values are the ceiling."""
    hits, nll, count = 0, 0.0, 0
    for ids, _, (start, end) in windows:
        logits = model(ids).logits.float()[0, start:end - 1]
        targets = ids[0, start + 1:end]
        hits += (logits.argmax(-1) == targets).sum().item()
        nll += F.cross_entropy(logits, targets, reduction="sum").item()
        count += targets.numel()
    return {"acc": hits / count, "nll": nll / count, "tokens": count}


def mixer_parameters(model, stage: str,
                     transfer_layers: tuple[int, ...] | None = None) -> dict[str, torch.nn.Parameter]:
    """``{name: parameter}`` trained in ``stage``: the GDN layers (those of ``transfer_layers`` if given) in
    attention transfer, every mixer after."""
    if stage != "transfer":
        return mixer_state(model, MIXERS)
    if transfer_layers is None:
        return mixer_state(model, (".linear_attn.",))
    return mixer_state(model, tuple(f"layers.{i}.linear_attn." for i in transfer_layers))


def transfer_loss(student, teacher, ids: torch.Tensor, layers: tuple[int, ...] | None = None) -> torch.Tensor:
    """Σ over GDN layers (those of ``layers`` if given) of ‖GDN(x) − attention(x)‖² / ‖attention(x)‖², x the
    teacher's own input to that layer."""
    pairs, hooks = {}, []
    gdn = {index: layer.linear_attn for index, layer in enumerate(student.model.layers)
           if hasattr(layer, "linear_attn") and (layers is None or index in layers)}
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


def student_precision() -> str:
    """``"bfloat16"`` (autocast) where this CPU computes it natively (oneDNN's check: AVX-512 BF16 or AMX), else
    ``"float32"``: without it a bf16 matmul is emulated, about 60x slower than float32 (AVX2, one thread)."""
    return "bfloat16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "float32"


def kd_loss(student, teacher, ids: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of KL(teacher ‖ student) of the next-token distributions; the student in
    :func:`student_precision`."""
    with torch.no_grad():
        target = F.log_softmax(teacher(ids).logits.float(), dim=-1)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=student_precision() == "bfloat16"):
        logits = student(ids).logits
    log_q = F.log_softmax(logits.float(), dim=-1)
    return (target.exp() * (target - log_q)).sum(-1).mean()


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

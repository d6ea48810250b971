"""The schedule of a distillation run (:mod:`hybridmodel.distill`), importable without torch: the ``bench`` CLI
reads its defaults for ``bench distill --help``.

A run is one **phase**. Phase 1 (the defaults) converts the teacher: attention transfer, then end-to-end
distillation on windows of the training sources. A later phase (``phase`` ≥ 2, :data:`PHASE_DEFAULTS`) starts from
the delta a previous phase saved (``bench distill --phase 2 --init-from DELTA``) and distils again under its own
schedule and text mix: no attention transfer, longer windows, and two kinds of windows besides plain text —

- **copy windows** (``copy_fraction``): a span of a training-source document that recurs later in the window; the
  teacher predicts the repeat by looking back with attention, so matching it there trains the hybrid's kept
  attention layers to retrieve across the window;
- **teacher samples** (``chat_fraction``): the teacher's own ChatML conversations about training-source snippets
  (``chat_pool`` of them, generated once, ``chat_tokens`` new tokens at most each), packed into the window;
- **recall windows** (``recall_fraction``, :mod:`hybridmodel.recall_windows`): everyday facts set at random depths
  of training-source text, asked back in ChatML and answered, of ``recall_lengths`` tokens (one drawn per window).

Configs of phase 1 written before these fields existed compare equal to the defaults (:meth:`DistillConfig.from_dict`),
so their checkpoints and deltas still resume.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from runtime.errors import UsageError

TEACHER_SAMPLES = "teacher_samples.jsonl"
"""The teacher's generated conversations: beside a run's checkpoint, and beside the delta it saves."""
MIN_RECALL = 256
"""The shortest recall window (its facts, questions and replies take at most half of it)."""
MIN_COPY = 2 * 2 + 4
"""The shortest copy window (:class:`hybridmodel.distill_windows.CopyWindows`): two copies of a span of at least 2
tokens and the 4 separators around them."""


@dataclass(frozen=True)
class DistillConfig:
    """The run's schedule; a checkpoint of one config is never resumed under another.

    Attributes
    ----------
    transfer_steps, kd_steps : int
        Steps of each stage (one window of ``length`` tokens per step); ``transfer_steps`` may be 0 (a later phase).
    length : int
        Tokens per window.
    transfer_lr, kd_lr : float
        Peak AdamW learning rates (cosine to 10 % of the peak after ``warmup`` steps, per stage).
    warmup : int
    seed : int
    eval_every : int
        Steps between held-out evaluations.
    eval_windows : int
        Held-out windows evaluated (``length`` tokens each).
    phase : int
        1: the conversion from the teacher; ≥ 2: a phase started from the delta of an earlier one. Steps are counted
        from the phase's start in the schedule (``learning_rate``, ``stage``); the log's steps go on from the
        delta's (``step`` = the delta's step + the phase's), each record carrying ``phase`` and ``phase_step``.
    copy_fraction, chat_fraction, recall_fraction : float
        Shares of the windows that are copy windows, teacher samples and recall windows (the rest is plain text).
    chat_pool : int
        Teacher conversations generated (lazily, cached beside the checkpoint) and drawn from.
    chat_tokens : int
        New tokens at most per teacher answer.
    chat_general_fraction : float
        Share of the pool's conversations whose user turn is a plain request about a word of the training
        documents (:data:`hybridmodel.distill_windows.GENERAL_INSTRUCTIONS`) instead of an instruction over a snippet.
    recall_lengths : tuple of int
        The lengths a recall window takes, one drawn per window (empty: ``length``).
    fresh_attention : bool
        A phase begun from a delta converts every attention layer afresh from the teacher (q/k in the linear regime
        of the norms, :mod:`hybridmodel.from_teacher`) and keeps only the delta's GDN layers.
    probe_windows : int
        Held-out copy windows of the retrieval probe at each evaluation (0: no probe).
    attention_layers : tuple of int
        The hybrid's full-attention layers; empty: Qwen3.5's every fourth (3, 7, ...). A phase begun from a delta
        of another placement moves its attention there (:func:`hybridmodel.from_teacher.resplit`) and may then run
        attention transfer (``transfer_steps``) on the layers that became GDN, before distilling.
    """

    transfer_steps: int = 300
    kd_steps: int = 1500
    length: int = 1024
    transfer_lr: float = 1e-3
    kd_lr: float = 2e-4
    warmup: int = 20
    seed: int = 0
    eval_every: int = 50
    eval_windows: int = 6
    phase: int = 1
    copy_fraction: float = 0.0
    chat_fraction: float = 0.0
    chat_pool: int = 0
    chat_tokens: int = 160
    chat_general_fraction: float = 0.0
    probe_windows: int = 0
    attention_layers: tuple[int, ...] = ()
    recall_fraction: float = 0.0
    recall_lengths: tuple[int, ...] = ()
    fresh_attention: bool = False

    def __post_init__(self):
        layers = self.attention_layers
        if isinstance(layers, str) or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
            raise UsageError(f"attention_layers={layers!r}: expected layer indices")
        object.__setattr__(self, "attention_layers", tuple(sorted(set(layers))))  # a JSON list reads back equal
        if any(i < 0 for i in self.attention_layers):
            raise UsageError(f"attention_layers={layers!r}: layer indices are >= 0")
        lengths = self.recall_lengths
        if isinstance(lengths, str) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= MIN_RECALL
                                               for n in lengths):
            raise UsageError(f"recall_lengths={lengths!r}: expected window lengths of at least {MIN_RECALL} tokens")
        object.__setattr__(self, "recall_lengths", tuple(sorted(set(lengths))))
        for name in ("transfer_steps", "kd_steps", "length", "warmup", "eval_every", "eval_windows", "phase",
                     "chat_pool", "chat_tokens", "probe_windows"):
            value = getattr(self, name)
            least = 0 if name in ("transfer_steps", "warmup", "chat_pool", "probe_windows") else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise UsageError(f"{name}={value!r}: expected an integer >= {least}")
        shares = ("copy_fraction", "chat_fraction", "recall_fraction")
        for name in shares:
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise UsageError(f"{name}={getattr(self, name)!r}: expected a share in [0, 1]")
        if not 0.0 <= self.chat_general_fraction <= 1.0:
            raise UsageError(f"chat_general_fraction={self.chat_general_fraction!r}: expected a share in [0, 1]")
        if sum(getattr(self, name) for name in shares) > 1.0:
            raise UsageError(f"{' + '.join(shares)} = {sum(getattr(self, name) for name in shares)}: over 1")
        if self.recall_fraction > 0 and not self.recall_lengths and self.length < MIN_RECALL:
            raise UsageError(f"recall windows of length {self.length}: give recall_lengths of at least {MIN_RECALL} "
                             "tokens")
        if (self.copy_fraction > 0 or self.probe_windows > 0) and self.length < MIN_COPY:
            uses = "copy windows (copy_fraction)" if self.copy_fraction > 0 else "the retrieval probe (probe_windows)"
            raise UsageError(f"length={self.length}: {uses} needs windows of at least {MIN_COPY} tokens (two copies "
                             "of a span of 2 or more, and 4 separators)")
        if not isinstance(self.fresh_attention, bool):
            raise UsageError(f"fresh_attention={self.fresh_attention!r}: expected true or false")
        if self.chat_fraction > 0 and self.chat_pool < 1:
            raise UsageError("chat_fraction > 0 needs a chat_pool of at least one conversation")
        if self.phase > 1 and self.transfer_steps and not self.attention_layers:
            raise UsageError(f"--transfer-steps {self.transfer_steps} (transfer_steps): phase {self.phase} starts "
                             "from a converted delta, so give --transfer-steps 0, unless the phase moves its "
                             "attention (--attention-layers), which makes new GDN layers to convert")

    @classmethod
    def from_dict(cls, saved: dict) -> "DistillConfig":
        """The config a checkpoint or a delta recorded (fields it predates take their defaults); ``ValueError`` for
        a field this version does not know."""
        unknown = set(saved) - {f.name for f in fields(cls)}
        if unknown:
            raise UsageError(f"a distillation config with unknown fields {sorted(unknown)}")
        return cls(**saved)

    @classmethod
    def for_phase(cls, phase: int, **given) -> "DistillConfig":
        """The defaults of ``phase`` (:data:`PHASE_DEFAULTS`) with ``given`` (None values ignored) over them."""
        if phase not in PHASE_DEFAULTS:
            raise UsageError(f"phase {phase}: choose one of {', '.join(map(str, PHASE_DEFAULTS))}")
        return cls(**{**PHASE_DEFAULTS[phase], **{k: v for k, v in given.items() if v is not None}, "phase": phase})

    @property
    def steps(self) -> int:
        return self.transfer_steps + self.kd_steps

    def stage(self, step: int) -> str:
        return "transfer" if step < self.transfer_steps else "kd"

    def learning_rate(self, step: int) -> float:
        first, count, peak = ((0, self.transfer_steps, self.transfer_lr) if self.stage(step) == "transfer"
                              else (self.transfer_steps, self.kd_steps, self.kd_lr))
        k = step - first
        if k < self.warmup:
            return peak * (k + 1) / self.warmup
        progress = (k - self.warmup) / max(1, count - self.warmup)
        return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


PHASE_DEFAULTS: dict[int, dict] = {
    1: {},
    2: {"transfer_steps": 0, "kd_steps": 360, "length": 2048, "kd_lr": 1.5e-4, "warmup": 20, "eval_every": 40,
        "eval_windows": 4, "copy_fraction": 0.5, "chat_fraction": 0.2, "chat_pool": 96, "chat_tokens": 160,
        "probe_windows": 4},
}
PHASE_DEFAULTS[3] = {**PHASE_DEFAULTS[2], "transfer_steps": 80, "transfer_lr": 1e-3, "kd_steps": 240,
                     "attention_layers": (7, 8, 14, 17, 18, 20, 21, 23)}
"""Each phase's schedule (what differs from :class:`DistillConfig`'s defaults). Phase 2 — retrieval over long
contexts and chat, from the phase-1 delta — is sized from costs measured on one thread beside other jobs: a step at
2,048 tokens 46-64 s, the teacher's generation 6.4 tokens/s (a pool of 96 answers of ≤ 160 tokens ≈ 40 min, ≈ 11 %
of the phase); 360 steps and the evaluations ≈ 6 core-hours (models/smollm2-135m-hybrid/README.md).

Phase 3 — full attention where the teacher retrieves, from the phase-2 delta — moves the attention from Qwen3.5's
every fourth layer (7) to the teacher's 8 layers of largest retrieval-head score (``benchmarks/
teacher_layer_split.py``, docs/realmodel/layer-split/): with every other layer restricted to a 128-token window the
teacher itself answers NIAH at 2,048 tokens (20 questions) 10 % of the time with attention at 3, 7, ..., 27 — as
often as with none — 35 % with its top 7, 60 % with its top 8 (and top 10), against 85 % with full attention
everywhere. The 5 layers that become GDN are trained by attention transfer first (80 steps, ≈ 15 s each:
one teacher forward, five GDN layers), then every mixer by distillation on phase 2's mix, held-out windows, probe
and teacher pool (240 steps, ≈ 40 s each where bf16 is native)."""
PHASE_DEFAULTS[4] = {**PHASE_DEFAULTS[3], "transfer_steps": 0, "kd_steps": 480, "kd_lr": 1e-4, "copy_fraction": 0.2,
                     "chat_fraction": 0.15, "recall_fraction": 0.45, "recall_lengths": (2048, 4096),
                     "fresh_attention": True}
"""Phase 4 — associative recall, from the phase-3 delta (the shipped one; same attention layers, so no transfer),
its 8 attention layers converted afresh from the teacher with q/k in the linear regime of Qwen3.5's norms (the
saturated norms of phases 1-3 had cost the teacher's attention its per-token q/k norms: the teacher itself, so
normalised in those layers, answers 0 of 20 NIAH questions it answers 17 of; docs/hybrid/qk-norm.md):
45 % recall windows (:mod:`hybridmodel.recall_windows`) of 2,048 or 4,096 tokens, 20 % copy windows, 15 % teacher
samples, 20 % plain text; phase 2's held-out windows, probe and teacher pool. Estimated, not yet measured: a
4,096-token window a little over twice a 2,048-token step (the GDN layers are linear in length, the 8 attention
layers quadratic), so a step ≈ 1.3 × phase 3's (≈ 55-80 s on one thread) and 480 steps ≈ 9 core-hours with the
evaluations — the log's ``train_seconds`` of the first steps say. The peak rate is lower than phase 3's: the delta
is distilled already."""
PHASE_DEFAULTS[5] = {**PHASE_DEFAULTS[4], "kd_steps": 240, "kd_lr": 5e-5, "copy_fraction": 0.1, "chat_fraction": 0.25,
                     "chat_pool": 400, "chat_general_fraction": 0.75, "fresh_attention": False}
"""Phase 5 — chat and recall, from the phase-4 delta (step 1619, ``git show 66df0d6:models/in-progress/``;
its attention kept). Phase 4 left one needle found as the teacher finds it but chat looping and four needles of one
form often confused (model card): a quarter of the windows are teacher samples, from a pool of 400 of which three
in four are plain requests about a word (:data:`hybridmodel.distill_windows.GENERAL_INSTRUCTIONS`) rather than
instructions over a snippet; recall windows keep their 45 % (several facts of one form among their layouts), copy
windows drop to 10 %, plain text 20 %. Planned cost: the pool ≈ 80 min of the teacher's generation on one thread
(≈ 12 s a conversation), 240 steps ≈ 4 core-hours."""



def config_difference(saved: dict | None, cfg: DistillConfig, default_layers: tuple[int, ...] = ()) -> str:
    """The settings in which a recorded distillation config ``saved`` differs from ``cfg``, as a message names
    them (``attention_layers 3, 7 there, 3, 6 here; phase 1 there, 3 here``), not the two whole configs. An empty
    ``attention_layers`` (the default placement) is shown as ``default_layers``, the layers it resolves to on the
    teacher, where given."""
    if saved is None:
        return "it records no config"
    mine = asdict(cfg)
    try:
        theirs = asdict(DistillConfig.from_dict(saved))
    except (TypeError, ValueError):  # a config of another version: compared as recorded
        theirs = dict(saved)

    def shown(value, key: str = "") -> str:
        if key == "attention_layers" and isinstance(value, (list, tuple)) and not value:
            return f"{shown(default_layers)} (the default)" if default_layers else "the default (every fourth from 3)"
        return ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)

    fields = [key for key in dict.fromkeys([*mine, *theirs]) if theirs.get(key) != mine.get(key)
              and not (isinstance(theirs.get(key), (list, tuple)) and isinstance(mine.get(key), (list, tuple))
                       and list(theirs[key]) == list(mine[key]))]
    return "; ".join(f"{key} {shown(theirs.get(key, '(none)'), key)} there, {shown(mine.get(key, '(none)'), key)} here"
                     for key in fields) or "the same settings in another form"

"""The distillation's curves as a picture: the training loss per stage and the held-out perplexity against the
teacher's, from the run's ``log.jsonl`` (:func:`hybridmodel.distill.distill` writes one line per step). A log of a
later phase opens with the history of the delta it began from (records without ``phase`` are phase 1); each phase
is drawn as its own series, against its own teacher perplexity (a phase may evaluate other windows), and the
retrieval probe of the phases that log one in a third panel."""

from __future__ import annotations

import json
from pathlib import Path


def read_log(path: Path) -> list[dict]:
    """The records of a distillation log; the last record of a step wins (a resumed run may repeat steps)."""
    records = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            records[record["step"]] = record
    return [records[step] for step in sorted(records)]


def plot(log_path: Path, out: Path) -> Path:
    """Two panels (three with a retrieval probe): loss by step (attention transfer: Σ relative MSE over GDN layers;
    distillation: KL in nats per token), held-out perplexity of the hybrid with the teacher's as a line, and the
    probe's accuracy on repeated spans with the teacher's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_log(log_path)
    phases = sorted({r.get("phase", 1) for r in records})
    probed = [r for r in records if "probe_acc" in r]
    fig, axes = plt.subplots(1, 3 if probed else 2, figsize=(16 if probed else 11, 4))
    loss_ax, ppl_ax = axes[0], axes[1]
    for phase in phases:
        mine = [r for r in records if r.get("phase", 1) == phase]
        for stage, label in (("transfer", "attention transfer (Σ relative MSE)"), ("kd", "distillation (KL, nats)")):
            steps = [r["step"] for r in mine if r.get("stage") == stage]
            if steps:
                loss_ax.plot(steps, [r["loss"] for r in mine if r.get("stage") == stage], lw=0.8,
                             label=label if phase == 1 else f"phase {phase}: {label}")
        evaluated = [r for r in mine if "heldout_ppl" in r]
        if evaluated:
            line, = ppl_ax.plot([r["step"] for r in evaluated], [r["heldout_ppl"] for r in evaluated], "o-",
                                label="hybrid" if len(phases) == 1 else f"hybrid, phase {phase}")
            teacher = evaluated[-1]["teacher_ppl"]
            span = [evaluated[0]["step"], evaluated[-1]["step"]] if len(phases) > 1 else None
            if span is None:
                ppl_ax.axhline(teacher, color="k", ls="--", label="teacher")
                ppl_ax.axhline(1.3 * teacher, color="gray", ls=":", label="1.3 × teacher (target)")
            else:
                ppl_ax.plot(span, [teacher] * 2, "--", color=line.get_color(), label=f"teacher, phase {phase}")
                ppl_ax.plot(span, [1.3 * teacher] * 2, ":", color=line.get_color())
    for phase in phases[1:]:
        first = min(r["step"] for r in records if r.get("phase", 1) == phase)
        for ax in (loss_ax, ppl_ax):
            ax.axvline(first - 1, color="gray", lw=0.6)
    loss_ax.set_yscale("log")
    loss_ax.set_xlabel("step (one window of the run's length)")
    loss_ax.set_title("training loss")
    loss_ax.legend()
    ppl_ax.set_yscale("log")
    ppl_ax.set_xlabel("step")
    ppl_ax.set_title("held-out perplexity" + (" (dotted: 1.3 × teacher)" if len(phases) > 1 else ""))
    ppl_ax.legend()
    if probed:
        probe_ax = axes[2]
        probe_ax.plot([r["step"] for r in probed], [r["probe_acc"] for r in probed], "o-", label="hybrid")
        probe_ax.plot([r["step"] for r in probed], [r["teacher_probe_acc"] for r in probed], "k--", label="teacher")
        probe_ax.set_ylim(0, 1)
        probe_ax.set_xlabel("step")
        probe_ax.set_title("retrieval probe: top-1 accuracy on repeated spans")
        probe_ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return Path(out)

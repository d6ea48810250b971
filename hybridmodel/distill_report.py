"""The distillation's curves as a picture: the training loss per stage and the held-out perplexity against the
teacher's, from the run's ``log.jsonl`` (:func:`hybridmodel.distill.distill` writes one line per step)."""

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
    """Two panels: loss by step (attention transfer: Σ relative MSE over GDN layers; distillation: KL in nats per
    token) and held-out perplexity of the hybrid with the teacher's as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_log(log_path)
    fig, (loss_ax, ppl_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for stage, label in (("transfer", "attention transfer (Σ relative MSE)"), ("kd", "distillation (KL, nats)")):
        steps = [r["step"] for r in records if r.get("stage") == stage]
        loss_ax.plot(steps, [r["loss"] for r in records if r.get("stage") == stage], label=label, lw=0.8)
    loss_ax.set_yscale("log")
    loss_ax.set_xlabel("step (one window of the run's length)")
    loss_ax.set_title("training loss")
    loss_ax.legend()
    evaluated = [r for r in records if "heldout_ppl" in r]
    ppl_ax.plot([r["step"] for r in evaluated], [r["heldout_ppl"] for r in evaluated], "o-", label="hybrid")
    if evaluated:
        ppl_ax.axhline(evaluated[-1]["teacher_ppl"], color="k", ls="--", label="teacher")
        ppl_ax.axhline(1.3 * evaluated[-1]["teacher_ppl"], color="gray", ls=":", label="1.3 × teacher (target)")
    ppl_ax.set_yscale("log")
    ppl_ax.set_xlabel("step")
    ppl_ax.set_title("held-out perplexity")
    ppl_ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return Path(out)

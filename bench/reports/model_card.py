"""The default model's card table: full-cache accuracy per task and length with 95 % bootstrap intervals over items
(``bench model-eval``; :mod:`bench.run.model_eval` measures it)."""

from __future__ import annotations

from .stats import PairedBootstrap


def accuracy_markdown(rows: list[dict], tasks: list[str], lengths: list[int], n: int,
                      bits_per_byte: dict[str, float]) -> str:
    """Markdown table: accuracy (%) of ``rows`` (one per answered question, ``task`` ``<task>@<length>``) per task
    and length with 95 % bootstrap intervals over the ``n`` items, a mean row over the NIAH tasks and vt where more
    than one was asked, and the held-out text's bits per byte."""
    boot = PairedBootstrap(rows, "score")
    head = "| task | " + " | ".join(f"{length}" for length in lengths) + " |"
    lines = [f"Accuracy (%), mean [95 % bootstrap interval over {n} items], full cache, greedy.", "", head,
             "|---|" + "---|" * len(lengths)]
    for task in tasks:
        lines.append(f"| {task} | " + " | ".join(boot.cell("none", 1.0, f"{task}@{length}").format(100, 0)
                                                for length in lengths) + " |")
    core = [t for t in tasks if t.startswith("niah") or t == "vt"]
    if len(core) > 1:  # named by what it averages: the tasks asked for, not a fixed set
        lines.append(f"| **mean of {', '.join(core)}** | " + " | ".join(
            boot.average("none", 1.0, [f"{t}@{length}" for t in core]).format(100, 1) for length in lengths) + " |")
    shown = ", ".join(f"{source} {value:.3f}" for source, value in bits_per_byte.items())
    lines += ["", f"Held-out generic text, bits per byte: {shown}"]
    return "\n".join(lines)

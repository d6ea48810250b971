"""What a model's own numbers say of its files: NaN or infinite values of the model itself (its keys and values in
its own prefill, or its log-probabilities on its own full cache), seen before any press acts, are the model's fault
and not a method's or the bench's; one line names the model and what to do about it."""

from __future__ import annotations

from pathlib import Path

import torch

from .catalog import CHECKPOINTS
from .file_record import RECORD_FILE


def model_fault(seen: str, directory: Path | None, dtype: torch.dtype) -> str:
    """The message naming the model in ``directory`` (None: built in memory) as what gave ``seen``.

    Parameters
    ----------
    seen : str
        What the model gave, as it follows "gives" (``"NaN or infinite keys or values at attention layer 3 in its
        own prefill"``).
    directory : Path or None
        The folder it was loaded from. One without a ``files.json`` (a user's own model) may have had its
        config.json edited, which nothing here can tell from damaged weights (probe 27, U2).
    dtype : torch.dtype
        The dtype it runs in: below float32 the values may only overflow.
    """
    shown = "the model" if directory is None else f"the model {directory.name} ({directory})"
    unrecorded = directory is not None and not (directory / RECORD_FILE).is_file()
    wide = dtype == torch.float32
    narrow = str(dtype).removeprefix("torch.")
    causes = ("its weights are damaged" + (" or its config.json was edited" if unrecorded else "")
              + ("" if wide else f" or overflow in {narrow}"))
    fetch = (f", or fetch it again: `bench fetch-model {directory.name}`"
             if directory is not None and directory.name in CHECKPOINTS else "")
    return (f"{shown} gives {seen}, before any press: {causes}: check its "
            f"{'weight files' if not unrecorded else 'files'} against where they came from{fetch}"
            f"{'' if wide else ', or run it in float32 (--dtype float32)'}")

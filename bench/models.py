"""Loading models for the bench: a local HF directory (default: the project's own trained hybrid)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from .model import DEFAULT_MODEL_DIR


def resolve(path: str | None) -> Path:
    directory = Path(path) if path else DEFAULT_MODEL_DIR
    if not (directory / "config.json").exists():
        hint = " (the default model ships in the repository; was it removed?)" if path is None else ""
        raise FileNotFoundError(f"no model at {directory}: expected a local HF model directory{hint}")
    return directory


def load(path: str | None = None, dtype: torch.dtype = torch.float32):
    """``(model, tokenizer, directory)``; offline only."""
    directory = resolve(path)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return model, tokenizer, directory

"""Loading models for the bench: a local HF directory (default: the project's own trained hybrid)."""

from __future__ import annotations

import hashlib
import json
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


def position_limit(path: str | None) -> int | None:
    """The model's ``max_position_embeddings`` read from its config alone (before any weight is loaded)."""
    directory = resolve(path)
    config = json.loads((directory / "config.json").read_text())
    return config.get("max_position_embeddings", config.get("text_config", {}).get("max_position_embeddings"))


def load(path: str | None = None, dtype: torch.dtype = torch.float32):
    """``(model, tokenizer, directory)``; offline only."""
    directory = resolve(path)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return model, tokenizer, directory


def fingerprint(directory: Path, pattern: str = "**/*.safetensors") -> str:
    """Content hash of the files matching ``pattern`` under a model directory. The default covers the weights and
    what was derived from them (calibration, GateSight estimator), so that results of a retrained model never pass
    for the old one's; ``"model*.safetensors"`` covers the weights alone."""
    digest = hashlib.sha256()
    for path in sorted(Path(directory).glob(pattern)):
        digest.update(path.relative_to(directory).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]

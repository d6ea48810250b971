"""Loading models for the bench (the default model itself lives in :mod:`bench.model`): a local directory or a hub id from the local Hugging Face cache, on a chosen
device and dtype (default: the project's own trained hybrid, float32 on CPU). Nothing is downloaded unless the
user allows it explicitly."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from .model import DEFAULT_MODEL_DIR, MODEL_ENV

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEVICES = "cpu, cuda, cuda:N or auto"


@dataclass(frozen=True)
class ModelSpec:
    """Which model to load and how.

    Attributes
    ----------
    path : str or None
        A local model directory, a hub id (``Qwen/Qwen3.5-0.8B``) found in the local Hugging Face cache, or None
        for the shipped default model.
    device : str
        ``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (cuda when available).
    dtype : str
        ``auto`` (the checkpoint's own), ``float32``, ``bfloat16`` or ``float16``.
    allow_download : bool
        Fetch a hub id that is not in the local cache (off by default: runs are offline).
    """

    path: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    allow_download: bool = False

    def __post_init__(self):
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; choose auto, {', '.join(DTYPES)}")
        self.torch_device()  # refuses a bad or unavailable device before anything loads

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            device = torch.device(self.device)
        except RuntimeError:
            raise ValueError(f"unknown device {self.device!r}; choose {DEVICES}") from None
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"unknown device {self.device!r}; choose {DEVICES}")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r} was asked for, but torch sees no CUDA device on this machine")
        if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {self.device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return device


def _spec(model) -> ModelSpec:
    return model if isinstance(model, ModelSpec) else ModelSpec(None if model is None else str(model))


def resolve(model: str | ModelSpec | None) -> Path:
    """The model's local directory: the path itself, or the hub id's snapshot in the local HF cache."""
    spec = _spec(model)
    if spec.path is None:
        if not (DEFAULT_MODEL_DIR / "config.json").exists():
            raise FileNotFoundError(f"no model at {DEFAULT_MODEL_DIR}: the default model ships with the source "
                                    f"checkout (models/hybrid-byte-12l); set {MODEL_ENV} to its directory, or pass --model")
        return DEFAULT_MODEL_DIR
    directory = Path(spec.path).expanduser()
    if (directory / "config.json").exists():
        return directory
    if directory.exists() or spec.path.count("/") != 1 or spec.path.startswith((".", "/", "~")):
        raise FileNotFoundError(f"no model at {spec.path}: expected a local HF model directory (with config.json) "
                                "or a hub id such as Qwen/Qwen3.5-0.8B")
    from huggingface_hub import snapshot_download
    from huggingface_hub.constants import HF_HUB_CACHE
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(spec.path, local_files_only=not spec.allow_download,
                                      allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken"]))
    except LocalEntryNotFoundError:
        raise FileNotFoundError(
            f"no model at {spec.path}: it is not a local directory, and the hub id is not in the local Hugging Face "
            f"cache ({HF_HUB_CACHE}); download it there first, or pass --allow-download"
        ) from None
    except Exception as error:  # the hub's own errors (unknown repository, gated model, no network)
        raise FileNotFoundError(f"could not fetch {spec.path} from the Hugging Face hub: {error}") from None


def position_limit(model: str | ModelSpec | None) -> int | None:
    """The model's ``max_position_embeddings`` read from its config alone (before any weight is loaded)."""
    config = json.loads((resolve(model) / "config.json").read_text())
    return config.get("max_position_embeddings", config.get("text_config", {}).get("max_position_embeddings"))


def load(model: str | ModelSpec | None = None):
    """``(model, tokenizer, directory)`` in eval mode, on the spec's device and dtype."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = _spec(model)
    directory = resolve(spec)
    dtype = "auto" if spec.dtype == "auto" else DTYPES[spec.dtype]
    loaded = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return loaded.to(spec.torch_device()).eval(), tokenizer, directory


def fingerprint(directory: Path, pattern: str = "**/*.safetensors") -> str:
    """Content hash of the files matching ``pattern`` under a model directory. The default covers the weights and
    what was derived from them (calibration, GateSight estimator), so that results of a retrained model never pass
    for the old one's; ``"model*.safetensors"`` covers the weights alone."""
    digest = hashlib.sha256()
    for path in sorted(Path(directory).glob(pattern)):
        digest.update(path.relative_to(directory).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]

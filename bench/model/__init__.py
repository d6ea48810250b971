"""The project's default model: a small Qwen3.5-architecture hybrid with a byte-level vocabulary, trained here."""

from pathlib import Path

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent.parent / "models" / "hybrid-byte-12l"

"""The project's default model: a small Qwen3.5-architecture hybrid with a byte-level vocabulary, trained here."""

import os
from pathlib import Path

MODEL_ENV = "HYBRIDPRESS_MODEL"
"""Where the default model is looked up first: a non-editable install has no source checkout beside it."""
DEFAULT_MODEL_DIR = Path(os.environ.get(MODEL_ENV) or Path(__file__).resolve().parent.parent.parent / "models" / "hybrid-byte-12l")

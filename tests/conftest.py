import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from tiny_models import MODELS  # noqa: E402

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tiny():
    """Cached tiny models by family name."""
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = MODELS[name]()
        return cache[name]

    return get

"""``python -m hybridmodel OUT_DIR [CHECKPOINT_DIR]``: train the default model (also ``bench train-model``)."""

import sys
from pathlib import Path

import torch

from .train import train

torch.set_num_threads(2)
out = Path(sys.argv[1])
train(out, Path(sys.argv[2]) if len(sys.argv) > 2 else out.parent / (out.name + "-checkpoints"),
      log=lambda line: print(line, flush=True))

#!/usr/bin/env bash
# Rebuild the shipped default model and everything derived from it, in order (CPU: a few hours; resumable).
#   LABELS (labelling windows, default 60), N (items per task for model-eval, default 20)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/hybrid-byte-12l
LABELS=${LABELS:-60}
N=${N:-20}
bench train-model --out "$MODEL" --checkpoints checkpoints/hybrid-byte-12l --replace  # the old model moves aside
bench calibrate --model "$MODEL"
bench label --model "$MODEL" --out results/labels --limit "$LABELS"
bench train --model "$MODEL" --labels results/labels
bench analyze --model "$MODEL" --labels results/labels --out docs/analysis
bench model-eval --model "$MODEL" --n "$N" --rows results/model-eval.jsonl
bench cost --model "$MODEL" --out docs

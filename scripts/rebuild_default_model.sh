#!/usr/bin/env bash
# Rebuild the shipped default model and everything derived from it, in order (CPU: a few hours; resumable).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/hybrid-byte-12l
bench train-model --out "$MODEL" --checkpoints checkpoints/hybrid-byte-12l
bench calibrate --model "$MODEL"
bench label --model "$MODEL" --out results/labels --limit 60
bench train --model "$MODEL" --labels results/labels
bench analyze --model "$MODEL" --labels results/labels --out docs/analysis
bench model-eval --model "$MODEL"

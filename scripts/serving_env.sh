#!/usr/bin/env bash
# The serving environment: the `serving` extra of pyproject.toml (vLLM's CPU build, the version serving/ was tested
# with) and the project's other dependencies but for kvpress, whose transformers pin vLLM's transformers breaks, so
# the serving path lives in its own virtual environment (default .venv-serving; about 3.5 GB, 2 minutes). vLLM pulls
# CUDA builds of torchvision/torchaudio/torchcodec that fail to import beside the CPU torch; the text models do not
# need them. Then it runs the serving tests: scripts/serving_env.sh [VENV]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv-serving}
if [ ! -x "$venv/bin/python" ]; then
  python -m venv "$venv"
fi
mapfile -t requirements < <("$venv/bin/python" - <<'PY'
import re
import tomllib

project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
serving = extras["serving"]
pinned = {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in serving}
# kvpress is left out (it refuses the serving transformers); what the serving extra pins, it pins
print("\n".join(serving + extras["test"] + [r for r in project["dependencies"]
                                           if re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower()
                                           not in pinned | {"kvpress"}]))
PY
)
"$venv/bin/pip" install -q "${requirements[@]}"
"$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$venv/bin/pip" install -q --no-deps -e .
"$venv/bin/python" -m pytest -q -m vllm tests/serving/test_serving_vllm.py -p no:cacheprovider

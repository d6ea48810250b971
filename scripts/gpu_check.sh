#!/usr/bin/env bash
# The GPU check. On a machine with CUDA: the fused kernels of the recurrent layers against the pure-torch ones, the
# runtime invariants and every press on the GPU (float32 and bfloat16), prefill / scoring / decode timings of a
# random-weight 0.8B-geometry hybrid at 16K and 64K tokens, and a short compare on the shipped model on cuda; every
# figure goes to one file (docs/gpu_check.md). Without CUDA it stops.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-docs/gpu_check.md}"
if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: torch sees no CUDA device on this machine; run it where one is (nothing was run)" >&2
  exit 2
fi
# first the fused recurrent kernels against the pure-torch ones (pip install ".[cuda]" brings them; a test that
# cannot run says why), then the runtime checks and timings
pip install -q ".[cuda]" || echo "gpu_check: the fused kernels could not be installed; their tests will skip" >&2
{ echo "# Fused kernels (tests/runtime/test_fused_kernels.py)"; echo; echo '```'
  # a failing kernel test is a finding to record, not a reason to skip the timings after it
  { python -m pytest -q -rs --tb=line -p no:cacheprovider tests/runtime/test_fused_kernels.py 2>&1 || true; } \
    | grep -v -e "fast path is not available" -e "^  warnings.warn" | tail -n 25
  echo '```'; echo; } > "$out.kernels"
cat "$out.kernels"
status=0  # a failed step is recorded and the steps after it still run; the script fails at the end
python scripts/gpu_check.py "$out" || status=$?
cat "$out.kernels" "$out" > "$out.all" && mv "$out.all" "$out" && rm "$out.kernels"
scratch=$(mktemp -d)
{ echo; echo "## Short compare on the shipped model (cuda)"; echo; echo '```'; } >> "$out"
TIMEFORMAT="compare wall time: %R s"
{ time bench compare --device cuda --press gatesight,keydiff,snapkv --alloc flat --keep-fractions 0.1 \
    --tasks niah_single_1 --n 4 --length 2048 --out "$scratch/results" 2>"$scratch/compare.log" | tail -n 25 \
    >> "$out"; } 2>> "$out" || { status=$?; tail -n 5 "$scratch/compare.log" >> "$out"; }
bench verify "$scratch/results" >> "$out" 2>&1 || status=$?
echo '```' >> "$out"
echo "figures written to $out"
exit "$status"

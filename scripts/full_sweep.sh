#!/usr/bin/env bash
# Regenerate docs/leaderboard.md and its committed store: presses × allocators × kept fractions on the default
# model. Resumable: rerun after an interruption and finished rows are kept.
#   N (items per task), LENGTH (tokens), RATIOS, TASKS, ALLOCS, JOBS may be overridden from the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-20}
LENGTH=${LENGTH:-2048}
RATIOS=${RATIOS:-0.02,0.05,0.1,0.2}
TASKS=${TASKS:-niah_single_1,niah_single_2,niah_multikey_1,niah_multivalue,niah_multiquery,vt}
ALLOCS=${ALLOCS:-flat}
JOBS=${JOBS:-2}
common=(--ratios "$RATIOS" --tasks "$TASKS" --n "$N" --length "$LENGTH" --jobs "$JOBS" --out results/board)
bench compare --press gatesight,snapkv,triattention,keydiff,kvzip --alloc "$ALLOCS" "${common[@]}"
bench compare --press kvzip --alloc global "${common[@]}"
mkdir -p docs/results
gzip -c results/board/results.jsonl > docs/results/results.jsonl.gz
bench leaderboard docs/results --out docs
bench verify docs/results --docs docs

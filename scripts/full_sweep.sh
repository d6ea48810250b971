#!/usr/bin/env bash
# Regenerate docs/leaderboard.md and its figures: every press × allocator × kept fraction over the 13 RULER tasks
# on the default model. Resumable: rerun after an interruption and finished rows are kept.
#   N (items per task), LENGTH (tokens), RATIOS may be overridden from the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-3}
LENGTH=${LENGTH:-1024}
RATIOS=${RATIOS:-0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9}
bench compare --press gatesight,snapkv,triattention,keydiff,kvzip --alloc flat,gate,pyramid \
  --ratios "$RATIOS" --tasks ruler --n "$N" --length "$LENGTH" --out results/sweep
bench compare --press kvzip,gatesight --alloc global \
  --ratios "$RATIOS" --tasks ruler --n "$N" --length "$LENGTH" --out results/sweep
bench leaderboard results/sweep --out docs

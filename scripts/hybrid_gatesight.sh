#!/usr/bin/env bash
# GateSight on the distilled hybrid (models/smollm2-135m-hybrid): labels by the paper's recipe (Eq. 2 over four
# sampled continuations of 128 tokens, the sampled futures alone), the estimator with its leave-one-corpus-out
# evaluation (MLP against ridge and the heuristics), the calibration (layer gate weights, TriAttention's
# statistics), the observations, then the sweep behind Tables 3 and 4: GateSight under gate / flat / PyramidKV and
# KVzip under its global allocation, at 2,048 tokens on the manual-page haystack (no role trains on it), the
# paper's grid plus p = 0.05, n items per task. Two processes of one thread each (one per core) for labelling and
# for the sweep. Resumable: label shards and the sweep's rows already written are kept; a trained estimator and a
# calibration already in the model directory are used as they are.
#   MODEL, OUT, WINDOWS (label windows, >= 500 for the issue), N (items per task), RATIOS, LENGTH, DOCS from the
#   environment.
# Cost on this 2-core CPU (SmolLM2's hybrid, one thread beside a second job): a window alone takes about 54 s
# (prefill 9 s, the four continuations 34 s as one batch, their labels 11 s); four windows labelled together
# (--together 4, their 16 continuations decoded as one batch) take 29 s a window, so 500 windows take about 2 h on
# the two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-smollm2-135m-hybrid}
OUT=${OUT:-results/hybrid}
WINDOWS=${WINDOWS:-500}
N=${N:-20}
RATIOS=${RATIOS:-0.05,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9}
LENGTH=${LENGTH:-2048}
DOCS=${DOCS:-docs/hybrid}
mkdir -p "$OUT" "$DOCS"
start=$(date +%s)
if [ ! -d "$MODEL" ]; then
  bench fetch-model "$MODEL"
fi
for k in 0 1; do
  OMP_NUM_THREADS=1 bench label --model "$MODEL" --futures labels --limit "$WINDOWS" --part "$k/2" --together 4 \
    --out "$OUT/labels" > "$OUT/label$k.log" 2>&1 &
done
wait
echo "labels: $(ls "$OUT/labels" | wc -l) windows, $(( $(date +%s) - start )) s wall so far"
artifacts=$(python -c "from pretrained.loading import resolve; print(resolve('$MODEL'))")
if [ ! -e "$artifacts/gatesight/gatesight.safetensors" ]; then
  OMP_NUM_THREADS=2 bench train --model "$MODEL" --labels "$OUT/labels" --futures labels > "$DOCS/train.md"
fi
if [ ! -e "$artifacts/calibration" ]; then
  OMP_NUM_THREADS=2 bench calibrate --model "$MODEL"
fi
OMP_NUM_THREADS=2 bench analyze --model "$MODEL" --labels "$OUT/labels" --out "$DOCS/analysis"
METHODS=gatesight/gate,gatesight/flat,gatesight/pyramid,kvzip/global
for k in 0 1; do
  OMP_NUM_THREADS=1 bench compare --model "$MODEL" --methods "$METHODS" --ratios "$RATIOS" \
    --tasks niah_single_2,niah_multikey_1 --haystack manpages --n "$N" --length "$LENGTH" --shard "$k/2" \
    --out "$OUT/sweep/shard$k" > "$OUT/sweep$k.log" 2>&1 &
done
wait
bench merge "$OUT/sweep/shard0" "$OUT/sweep/shard1" --out "$OUT/sweep/merged"
echo "GateSight on $MODEL: $(( $(date +%s) - start )) s wall; rows in $OUT/sweep/merged"

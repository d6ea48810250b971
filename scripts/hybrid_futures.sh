#!/usr/bin/env bash
# Which future should GateSight's labels read on the distilled hybrid? The shipped estimator fits the paper's
# labels (Eq. 2 over sampled continuations alone) and loses to KVzip/global (docs/hybrid/README.md); KVzip scores
# what reconstructing the context needs. Here one set of windows is labelled with both futures (`bench label
# --futures both`: the sampled continuations and the reconstruction future) and two estimators are trained on the
# same windows: `labels` (the sampled futures alone, the shipped recipe) and `both` (the maximum of the two). Each
# goes into a copy of the rebuilt model directory (hard links; only gatesight/ differs), GateSight/gate runs on
# each over the items, grid and haystack of the leaderboard's smollm2-135m-hybrid group, and scripts/paired_runs.py
# pairs them with that group's rows (the no-prune rows must agree exactly, or it refuses).
#   MODEL, OUT, WINDOWS, N, KEEP_FRACTIONS, LENGTH, DOCS from the environment. Resumable: label shards, estimators and
#   sweep rows already written are kept.
# Cost on this 2-core CPU: labels with both futures take 40 s a window in each of two one-thread processes (twice
# the sampled futures alone), so 250 windows take about 84 min.
set -euo pipefail
# glibc's large blocks on huge pages: 1.14-2x less time on a CPU, the same numbers (docs/profile_realmodel.md)
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.malloc.hugetlb=1}
cd "$(dirname "$0")/.."
MODEL=${MODEL:-smollm2-135m-hybrid}
OUT=${OUT:-results/hybrid-both}
WINDOWS=${WINDOWS:-250}
N=${N:-20}
KEEP_FRACTIONS=${KEEP_FRACTIONS:-0.05,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9}
LENGTH=${LENGTH:-2048}
DOCS=${DOCS:-docs/hybrid/futures}
mkdir -p "$OUT/models" "$DOCS"
start=$(date +%s)
bench fetch-model "$MODEL"
artifacts=$(python -c "from pretrained.loading import resolve; print(resolve('$MODEL'))")
scripts/label_in_parts.sh "$MODEL" both "$WINDOWS" "$OUT"
echo "labels: $(ls "$OUT/labels" | wc -l) windows, $(( $(date +%s) - start )) s wall so far"
for futures in labels both; do
  variant="$OUT/models/$MODEL-$futures"
  if [ ! -e "$variant/gatesight/gatesight.safetensors" ]; then
    rm -rf "$variant"
    cp -al "$artifacts" "$variant"  # new files are written beside the links (atomic renames), never into them
    rm -r "$variant/gatesight"
    OMP_NUM_THREADS=2 bench train --model "$variant" --labels "$OUT/labels" --futures "$futures" \
      > "$DOCS/train-$futures.md"
  fi
done
echo "estimators: $(( $(date +%s) - start )) s wall so far"
# one variant a core
pids=()
for futures in labels both; do
  OMP_NUM_THREADS=1 bench compare --model "$OUT/models/$MODEL-$futures" --methods gatesight/gate \
    --keep-fractions "$KEEP_FRACTIONS" --tasks niah_single_2,niah_multikey_1 --haystack manpages --n "$N" \
    --length "$LENGTH" --out "$OUT/sweep-$futures" > "$OUT/sweep-$futures.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
for futures in labels both; do  # the rows behind docs/hybrid/futures, as committed stores are kept
  mkdir -p "$DOCS/sweep-$futures"
  gzip -n -c "$OUT/sweep-$futures/results.jsonl" > "$DOCS/sweep-$futures/results.jsonl.gz"
done
echo "sweeps: $(( $(date +%s) - start )) s wall"
python scripts/paired_runs.py "shipped=docs/results#$MODEL" "labels=$DOCS/sweep-labels" "both=$DOCS/sweep-both" \
  --keep-fractions "$KEEP_FRACTIONS" --pairs "gatesight/gate [both]-gatesight/gate [labels]" \
  "gatesight/gate [both]-kvzip/global [shipped]" "gatesight/gate [labels]-kvzip/global [shipped]" \
  "gatesight/gate [labels]-gatesight/gate [shipped]" > "$DOCS/paired.md"

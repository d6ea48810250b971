#!/usr/bin/env bash
# GateSight on the distilled hybrid (models/smollm2-135m-hybrid): labels of both futures (Eq. 2 over four sampled
# continuations of 128 tokens and over the window asked back, docs/hybrid/futures; FUTURES=labels for the paper's
# sampled futures alone), the estimator with its leave-one-corpus-out
# evaluation (MLP against ridge and the heuristics), the calibration (layer gate weights, TriAttention's
# statistics), the observations, then the sweep behind Tables 3 and 4: GateSight under gate / flat / PyramidKV, KVzip
# under its global allocation and SnapKV, TriAttention, KeyDiff under flat budgets, at 2,048 tokens on the manual-page haystack (no role trains on it), the
# paper's grid plus p = 0.05, n items per task. Two processes of one thread each (one per core) for labelling and
# for the sweep. Resumable: label shards and the sweep's rows already written are kept; a trained estimator and a
# calibration already in the model directory (shipped with the delta: bench ship-artifacts) are used as they are.
# NO_SWEEP=1 stops after shipping the estimator (a session of labelling); the sweep's group is appended to the
# committed store (docs/results), then the leaderboard is regenerated and verified.
#   MODEL, OUT, WINDOWS (label windows, >= 500 for the issue), N (items per task), KEEP_FRACTIONS, LENGTH, DOCS from the
#   environment.
# Cost on this 2-core CPU (SmolLM2's hybrid): four windows labelled together (--together 4, their 16 continuations
# decoded as one batch) take 19.6 s a window in each of the two one-thread processes (the mean of 500 shards' own
# timings), so 500 windows take about 82 min on the two cores; with both futures (the default) 26.4 s a window
# alone (benchmarks/label_cost.py, 4 windows together, one thread), about 110 min for 500 on the two cores
# (≈ 1.2 MB of labels a window: they are not kept in the repository); bench train and bench analyze on them 17 min on two threads; the sweep 98 s a context (71
# forks) on one thread, 33 min for n = 20 on the two cores: 2 h 12 min for the whole script.
set -euo pipefail
# glibc's large blocks on huge pages: 1.14-2x less time on a CPU, the same numbers (docs/profile_realmodel.md)
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.malloc.hugetlb=1}
cd "$(dirname "$0")/.."
MODEL=${MODEL:-smollm2-135m-hybrid}
FUTURES=${FUTURES:-both}
OUT=${OUT:-results/hybrid}
WINDOWS=${WINDOWS:-500}
N=${N:-20}
KEEP_FRACTIONS=${KEEP_FRACTIONS:-0.05,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9}
LENGTH=${LENGTH:-2048}
DOCS=${DOCS:-docs/hybrid}
mkdir -p "$OUT" "$DOCS"
start=$(date +%s)
bench fetch-model "$MODEL"  # nothing to do when it is rebuilt from the current delta
artifacts=$(python -c "from pretrained.loading import resolve; print(resolve('$MODEL'))")
if [ ! -e "$artifacts/calibration/calibration.safetensors" ]; then
  OMP_NUM_THREADS=2 bench calibrate --model "$MODEL"
fi
# labels, the estimator and the observations, unless the delta ships an estimator already (labels are not kept
# in the repository: a session labels, trains, analyses and ships in one go)
if [ ! -e "$artifacts/gatesight/gatesight.safetensors" ]; then
  scripts/label_in_parts.sh "$MODEL" "$FUTURES" "$WINDOWS" "$OUT"
  echo "labels: $(ls "$OUT/labels" | wc -l) windows, $(( $(date +%s) - start )) s wall so far"
  OMP_NUM_THREADS=2 bench train --model "$MODEL" --labels "$OUT/labels" --futures "$FUTURES" > "$DOCS/train.md"
  OMP_NUM_THREADS=2 bench analyze --model "$MODEL" --labels "$OUT/labels" --out "$DOCS/analysis"
  echo "estimator and observations: $(( $(date +%s) - start )) s wall so far"
fi
bench ship-artifacts "$MODEL"  # the delta carries the estimator and the calibration the sweep runs with
if [ -n "${NO_SWEEP:-}" ]; then
  exit 0
fi
# Table 3 (GateSight under its gate allocation beside the paper's four baselines) and Table 4 (GateSight's
# allocations)
METHODS=gatesight/gate,snapkv/flat,triattention/flat,keydiff/flat,kvzip/global,gatesight/flat,gatesight/pyramid
pids=()
for k in 0 1; do
  OMP_NUM_THREADS=1 bench compare --model "$MODEL" --methods "$METHODS" --keep-fractions "$KEEP_FRACTIONS" \
    --tasks niah_single_2,niah_multikey_1 --haystack manpages --n "$N" --length "$LENGTH" --shard "$k/2" \
    --out "$OUT/sweep/shard$k" > "$OUT/sweep$k.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
bench merge "$OUT/sweep/shard0" "$OUT/sweep/shard1" --out "$OUT/sweep/merged"
echo "GateSight on $MODEL: $(( $(date +%s) - start )) s wall; rows in $OUT/sweep/merged"
# the committed store holds every group: the other models' rows, then these (an older run of this group replaced)
python - "$OUT/sweep/merged/results.jsonl" "$MODEL" <<'PY'
import gzip, json, sys
store = "docs/results/results.jsonl.gz"
kept = [line for line in gzip.open(store, "rt") if json.loads(line)["model"] != sys.argv[2]]
with gzip.GzipFile(store + ".new", "wb", mtime=0) as out:
    out.write("".join(kept + list(open(sys.argv[1]))).encode())
PY
mv docs/results/results.jsonl.gz.new docs/results/results.jsonl.gz
bench leaderboard docs/results --out docs
bench verify docs/results --docs docs

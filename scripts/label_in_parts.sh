#!/usr/bin/env bash
# bench label in two one-thread processes (one a core), parts 0/2 and 1/2 of one corpus into one folder, four
# windows labelled together in each; the logs beside the folder (label0.log, label1.log). A failed part fails the
# script. Usage: scripts/label_in_parts.sh MODEL FUTURES WINDOWS OUT_DIR (labels in OUT_DIR/labels).
set -euo pipefail
model=$1 futures=$2 windows=$3 out=$4
mkdir -p "$out"
pids=()
for k in 0 1; do
  OMP_NUM_THREADS=1 bench label --model "$model" --futures "$futures" --limit "$windows" --part "$k/2" --together 4 \
    --out "$out/labels" > "$out/label$k.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done  # a failed part stops the script (a bare wait would not)

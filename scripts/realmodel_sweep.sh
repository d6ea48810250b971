#!/usr/bin/env bash
# The leaderboard's real-model group: SmolLM2-135M-Instruct (bench fetch-model smollm2-135m-instruct), the RULER
# tasks it answers with a full cache on the manual-page haystack, 2,048 tokens, n = 20 per task, the paper's grid
# p = 0.1 … 0.9; SnapKV, TriAttention, KeyDiff, KVzip (global and flat) and kvpress's ExpectedAttention, Knorm and
# TOVA, with the allocators that change the picture (SnapKV under Ada-KV, KeyDiff under PyramidKV), and the static
# budget across heads (head_shares, issue 66) under KVzip, KeyDiff and SnapKV. Before the sweep, the calibrations
# its methods read, kept with the cached model: TriAttention's (bench calibrate) and the head shares by kept fraction
# (bench calibrate-shares, its file then copied to docs/hybrid/budgets_across_heads/smollm2-135m-instruct/).
# Two shards, one thread each (one per core), then merged and the group replaced in docs/results. Resumable
# (≈ 110 min on the two cores); to span sessions, pack the shards into the tree before stopping and unpack them
# after: python scripts/shard_packs.py pack|unpack "$(dirname "$OUT")" docs/hybrid/group/in-progress-instruct
#   OUT from the environment (the shards are $OUT/shard0 and $OUT/shard1); to be packed, OUT's own name starts with
#   "sweep" (OUT=/work/inst/sweep-instruct).
set -euo pipefail
# glibc's large blocks on huge pages: 1.14-2x less time on a CPU, the same numbers (docs/profile_realmodel.md)
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.malloc.hugetlb=1}
cd "$(dirname "$0")/.."
OUT=${OUT:-results/realmodel}
METHODS=snapkv/flat,snapkv/adakv,triattention/flat,keydiff/flat,keydiff/pyramid,kvzip/global,kvzip/flat
METHODS=$METHODS,kvpress:ExpectedAttentionPress/flat,kvpress:KnormPress/flat,kvpress:TOVAPress/flat
METHODS=$METHODS,kvzip/head_shares,keydiff/head_shares,snapkv/head_shares
bench fetch-model smollm2-135m-instruct
model_dir="${HYBRIDPRESS_CACHE:-$HOME/.cache/hybridpress}/models/smollm2-135m-instruct"
[ -e "$model_dir/calibration/calibration.safetensors" ] || OMP_NUM_THREADS=2 bench calibrate --model smollm2-135m-instruct
# the shares by kept fraction (format 2; the teacher's committed file is the one set of before), kept in the tree:
# the teacher's directory is the cache's, converted from its wheel
if [ ! -e "$model_dir/calibration/head_shares.json" ]; then
  OMP_NUM_THREADS=2 bench calibrate-shares --model smollm2-135m-instruct --windows 14 --tokens 2048
  cp "$model_dir/calibration/head_shares.json" docs/hybrid/budgets_across_heads/smollm2-135m-instruct/
fi
start=$(date +%s)
for k in 0 1; do
  OMP_NUM_THREADS=1 bench compare --model smollm2-135m-instruct --methods "$METHODS" --keep-fractions paper \
    --tasks niah_single_2,niah_multikey_1 --haystack manpages --n 20 --length 2048 --shard "$k/2" \
    --out "$OUT/shard$k" > "$OUT.shard$k.log" 2>&1 &
done
wait
echo "real-model sweep: $(( $(date +%s) - start )) s wall"
bench merge "$OUT/shard0" "$OUT/shard1" --out "$OUT/merged"
# docs/results is one store per setting group and method (bench publish); an older run of this group leaves first
rm -rf docs/results/smollm2-135m-instruct-2048-*
bench publish "$OUT/merged" --into docs/results
bench leaderboard docs/results --out docs
bench verify docs/results --docs docs

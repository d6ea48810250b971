#!/usr/bin/env bash
# The GateSight issue's group on the shipped hybrid, in steps that each resume and that span sessions:
#   labels       500 windows labelled with both futures (bench label, two one-thread processes, --together 4):
#                26–28 s a window in each process (the step's own logs), ≈ 115 min on the two cores.
#                Labels are ≈ 1.2 MB a window and not committed: run this step and the next in one session.
#   estimators   the shipped default estimator retrained on them (per-(layer, head) scale, both futures; the old
#                one moved aside by --replace) with its leave-one-corpus-out table, and the one-scale estimator
#                that gatesight/global reads (bench train --scale one), committed in $GROUP/one-scale; both
#                shipped with the delta (bench ship-artifacts). Every row below depends on them (the artifacts
#                fingerprint), so the sweeps start after this step.
#   sweep2k K/N  shard K of N of the 2,048-token group: five tasks, n = 30, 15 methods × 8 kept fractions + the
#                full cache (rerun on the shipped haystack snapshots from 2026-12-06: the group published before
#                read another machine's manual pages; n and the grid cut to fit ≈ 4 h on two cores). One process a shard (one thread); a store per shard in $OUT/sweep2k/shardK.
#   sweep4k K/N  the 4,096-token part: n = 30, GateSight's best allocations, KVzip/global, KeyDiff, SnapKV (run
#                from the worktree below with this script copied in: its METHODS_4K is this one's).
#   pack         each shard's rows as results.jsonl.gz in $GROUP/in-progress/ (committable, so that the next
#                session resumes them: bench compare resumes a committed .gz) — run before a session ends.
#   unpack       the committed shards back into $OUT, to resume them.
#   publish      merge the shards, add the group to docs/results, regenerate and verify the leaderboard.
# A store resumes only under the code version its rows carry: where the code changed since the shard began, run the
# sweep step from a worktree of that commit (git worktree add /tmp/wt COMMIT; then /tmp/wt/scripts/gatesight_group.sh
# sweep2k K/N with OUT the absolute path of the same stores). `bench` runs the code of the checkout this script is in
# (PYTHONPATH below), not the one pip installed in editable mode.
#   MODEL, OUT, GROUP, KEPT, WINDOWS, N2K, N4K, TASKS, PART, METHODS_2K, METHODS_4K from the environment. Cost:
#   niah_multikey_1 asks four questions a context, ≈ 7 min a context at 2,048 tokens on one thread (≈ 2 min at 4,096, six methods, four
#   fractions), so it runs as a part of its own, begun with fewer contexts and grown to n (a store takes a larger
#   --n of the same run and answers only the new contexts):
#     TASKS=niah_multikey_1 PART=mk scripts/gatesight_group.sh sweep2k 0/2
#   A part's stores are $OUT/sweep2k-PART/shardK (a store holds one run: its tasks, n and shards).
set -euo pipefail
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.malloc.hugetlb=1}
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
MODEL=${MODEL:-smollm2-135m-hybrid}
OUT=${OUT:-results/gatesight-group}
GROUP=${GROUP:-docs/hybrid/group}
WINDOWS=${WINDOWS:-500}
N2K=${N2K:-30}
N4K=${N4K:-30}
TASKS=${TASKS:-niah_single_2,niah_multivalue,niah_multiquery,vt}  # niah_multikey_1: its own PART (above)
ONE_SCALE="$GROUP/one-scale"
KEPT=${KEPT:-$GROUP/in-progress}
GROUP_2K="gatesight/gate,gatesight/flat,gatesight/pyramid,gatesight[estimator=$ONE_SCALE]/global,kvzip/global"
GROUP_2K="$GROUP_2K,kvzip/flat,keydiff/flat,snapkv/flat,triattention/flat,kvpress:TOVAPress/flat"
GROUP_2K="$GROUP_2K,kvpress:ExpectedAttentionPress/flat"
# the calibrated budget across heads (issue 66) under GateSight and the three scorers it lifted on the slice
GROUP_2K="$GROUP_2K,gatesight/head_shares,kvzip/head_shares,keydiff/head_shares,snapkv/head_shares"
# METHODS_2K / METHODS_4K from the environment: only those methods, e.g. a method joining the published group (or
# one whose own code changed) — give another OUT and KEPT (where pack keeps its shards), then the publish step
METHODS_2K=${METHODS_2K:-$GROUP_2K}
FRACTIONS_2K=0.02,0.05,0.1,0.2,0.3,0.4,0.5,0.7
# GateSight's two best allocations at 2,048 tokens (gate and flat, a tie there) and the one-scale global variant
GROUP_4K="gatesight/gate,gatesight/flat,gatesight[estimator=$ONE_SCALE]/global,kvzip/global,keydiff/flat,snapkv/flat"
GROUP_4K="$GROUP_4K,gatesight/head_shares,kvzip/head_shares"
METHODS_4K=${METHODS_4K:-$GROUP_4K}
FRACTIONS_4K=0.05,0.1,0.2,0.3,0.4,0.5
step=${1:?"give a step: labels, estimators, sweep2k K/N, sweep4k K/N, pack, unpack or publish"}
mkdir -p "$OUT" "$GROUP"
case "$step" in
  labels)
    bench fetch-model "$MODEL"
    scripts/label_in_parts.sh "$MODEL" both "$WINDOWS" "$OUT"
    ;;
  estimators)
    # the two fits side by side, one thread each (one a core): neither waits on the other
    OMP_NUM_THREADS=1 bench train --model "$MODEL" --labels "$OUT/labels" --futures both --replace \
      > "$GROUP/train.md" 2> "$OUT/train.log" &
    head_scale=$!
    OMP_NUM_THREADS=1 bench train --model "$MODEL" --labels "$OUT/labels" --futures both --scale one \
      --out "$ONE_SCALE" --replace > "$GROUP/train-one-scale.md" 2> "$OUT/train-one-scale.log" &
    one_scale=$!
    wait "$head_scale"
    wait "$one_scale"
    bench ship-artifacts "$MODEL"
    ;;
  sweep2k|sweep4k)
    shard=${2:?"give the shard, K/N"}
    if [ "$step" = sweep2k ]; then
      set -- --methods "$METHODS_2K" --keep-fractions "$FRACTIONS_2K" --n "$N2K" --length 2048
    else
      set -- --methods "$METHODS_4K" --keep-fractions "$FRACTIONS_4K" --n "$N4K" --length 4096
    fi
    OMP_NUM_THREADS=1 bench compare --model "$MODEL" --tasks "$TASKS" --haystack manpages "$@" --shard "$shard" \
      --out "$OUT/$step${PART:+-$PART}/shard${shard%/*}"
    ;;
  pack|unpack)
    python scripts/shard_packs.py "$step" "$OUT" "$KEPT"
    ;;
  publish)
    for part in "$OUT"/sweep*/; do
      bench merge "$part"shard* --out "$part"merged
    done
    # one file per group and method: a second publish (a part grown since) adds only the rows it has not added
    bench publish "$OUT"/sweep*/merged --into docs/results
    bench leaderboard docs/results --out docs
    bench verify docs/results --docs docs
    ;;
  *)
    echo "unknown step $step: labels, estimators, sweep2k K/N, sweep4k K/N, pack, unpack or publish" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# The hybrid issue's targets for one delta (an in-progress phase's, or the shipped one) against its teacher on the
# same questions: full-cache accuracy on four needle tasks over manual pages (no distillation role reads them) at
# each length, with the share of the teacher's and its interval (benchmarks/model_vs_teacher.py); long-context
# perplexity on held-out and unread sources (benchmarks/long_context_ppl.py); greedy chat answers to the committed
# and the new questions (benchmarks/chat_answers.py). The model is built from the delta on the converted teacher
# (`bench fetch-model smollm2-135m-instruct` first) into MODEL_DIR (default: the model cache's targets/ folder,
# named as the delta's folder, the name its rows record), never into OUT.
#
#   scripts/hybrid_targets.sh DELTA [OUT]       e.g. models/smollm2-135m-hybrid docs/hybrid/phase5
#
# LENGTHS, N (contexts a task: n = 50 questions, 200 for niah_multikey_1's four a context), TASKS and WINDOWS (of
# the long-context perplexity, a source) from the environment. The teacher's stores are read from TEACHER_STORES
# (default docs/hybrid/phase5, which holds the default run: same tasks, n, length, haystack and seed, so the same
# questions; give another TEACHER_STORES for another run), else run into OUT. Resumable: a store's
# rows already written are kept. Cost on one thread of this machine (SmolLM2 size, measured on phase 5's delta):
# 12.4 s a context of 2,048 tokens and 28 s of 4,096 (200 contexts a length: 41 and 95 min a model), 15 min of
# perplexities, 5 min of chat.
set -euo pipefail
# glibc's large blocks on huge pages: 1.14-2x less time on a CPU, the same numbers (docs/profile_realmodel.md)
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.malloc.hugetlb=1}
cd "$(dirname "$0")/.."
DELTA=${1:?usage: scripts/hybrid_targets.sh DELTA [OUT]}
OUT=${2:-docs/hybrid/$(basename "$DELTA")}
LENGTHS=${LENGTHS:-2048 4096}
N=${N:-50}
TASKS=${TASKS:-niah_single_2,niah_multikey_1,niah_multivalue,niah_multiquery}
TEACHER=smollm2-135m-instruct
TEACHER_STORES=${TEACHER_STORES:-docs/hybrid/phase5}
WINDOWS=${WINDOWS:-8}
MODEL_DIR=${MODEL_DIR:-$(python -c "from pretrained.model_cache import cache_dir; print(cache_dir())")/targets/$(basename "$DELTA")}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
[ -f "$DELTA/hybrid.json" ] || { echo "hybrid_targets: $DELTA holds no hybrid delta (hybrid.json)" >&2; exit 2; }
mkdir -p "$OUT"
model=$MODEL_DIR
if [ ! -f "$model/config.json" ]; then
  python - "$DELTA" "$model" <<'EOF'
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from hybridmodel.hybrid_delta import TOKENIZER_FILES, build
from pretrained.model_cache import locate

delta, out = Path(sys.argv[1]), Path(sys.argv[2])
teacher_dir = locate("smollm2-135m-instruct")
teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32, local_files_only=True)
build(delta, teacher).save_pretrained(out)
for name in TOKENIZER_FILES:
    if (teacher_dir / name).exists():
        shutil.copyfile(teacher_dir / name, out / name)
print(f"built {out} from {delta}")
EOF
fi
for length in $LENGTHS; do
  # a committed teacher store is read as it is: rerun under today's code it would start anew beside its rows
  teacher_store="$TEACHER_STORES/niah-$length-$TEACHER"
  runs=("$model:$OUT/niah-$length-model")
  if [ ! -d "$teacher_store" ]; then
    teacher_store="$OUT/niah-$length-$TEACHER"
    runs+=("$TEACHER:$teacher_store")
  fi
  for store_model in "${runs[@]}"; do
    store=${store_model#*:}
    bench compare --model "${store_model%%:*}" --press none --tasks "$TASKS" --n "$N" --length "$length" \
      --haystack manpages --out "$store" > "$OUT/$(basename "$store").log" 2>&1
  done
  python benchmarks/model_vs_teacher.py --teacher "$teacher_store" --model "$OUT/niah-$length-model" \
    --out "$OUT/niah-$length.md"
done
python benchmarks/long_context_ppl.py --models "$TEACHER,$model" --sources licenses:heldout,python-stdlib:heldout \
  --windows "$WINDOWS" --out "$OUT/long-context-ppl-heldout.json"
python benchmarks/long_context_ppl.py --models "$TEACHER,$model" --sources manpages,perl-pod \
  --windows "$WINDOWS" --out "$OUT/long-context-ppl-unread-sources.json"
for questions in committed new; do
  python benchmarks/chat_answers.py --models "$TEACHER,$model" --questions "$questions" --out "$OUT/chat-$questions.md"
done
echo "targets of $DELTA written to $OUT"

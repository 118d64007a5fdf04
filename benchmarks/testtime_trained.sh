#!/usr/bin/env bash
# Test-time private rehearsal on a trained checkpoint vs its own warm start (issue #20: the paper's
# contrast, trained policy vs base), on the run's own task distribution (eval reads it from the
# run's config.yaml), the same tasks and seeds for both:
#
#   bash benchmarks/testtime_trained.sh RUN_DIR [OUT_DIR] [TASKS_PER_WORLD] [BUDGETS]
#
# RUN_DIR: a finished `envace train` run (e.g. of configs/demo.yaml); its latest checkpoint is the
# trained policy, <run>/sft/step-00000000 the warm start. MEMORY=plan (default) or rule: the small
# models here cannot summarise, and copy what a rule memory lists, its failed calls included.
# MODES=parallel runs only the parallel mode (default parallel,sequential).
# Then `python benchmarks/testtime_compare.py OUT/trained OUT/warm` prints the paired table. DTYPE=bfloat16 generates with a bf16 copy of each model (about half the time on
# a CPU with AVX512-BF16; both sides run in the same dtype).
set -euo pipefail
RUN=${1:?usage: testtime_trained.sh RUN_DIR [OUT_DIR] [TASKS_PER_WORLD] [BUDGETS]}
OUT=${2:-runs/testtime-trained}
TASKS=${3:-20}
BUDGETS=${4:-0,1,2,4}
DTYPE=${DTYPE:-float32}
MEMORY=${MEMORY:-plan}
MODES=${MODES:-parallel,sequential}
export HF_HUB_OFFLINE=1
LAST=$(ls -d "$RUN"/checkpoints/step-* | sort | tail -1)
for pair in "trained:$LAST" "warm:$RUN/sft/step-00000000"; do
    name=${pair%%:*}; model=${pair#*:}
    envace eval --model "$model" --tasks "$TASKS" --sweep --budgets "$BUDGETS" --memory "$MEMORY" --modes "$MODES" \
        --threads 1 --seed 0 --dtype "$DTYPE" --out "$OUT" --name "$name"
done
python "$(dirname "$0")/testtime_compare.py" "$OUT/trained" "$OUT/warm"

#!/usr/bin/env bash
# The demo on three task pools (seeds 0, 1, 2): rehearsal training as configs/demo.yaml runs it,
# then the baselines from the same warm start (RL against the real worlds, and against a frozen
# copy of the warm start as simulator), and the real-world eval gain of each run paired over its
# 16 tasks, pooled over the seeds (benchmarks/eval_gain.py). BASELINES="real" limits them.
#   bash benchmarks/demo_seeds.sh [OUT]          (default runs/demo-seeds-<date>; ~30 min a seed on one core)
# PARALLEL=1 runs the seeds side by side, one thread each (2 at a time on a 2-core machine is the
# most that does not slow each run down). SETS="--set steps=2 ..." adds overrides to every run.
set -euo pipefail
OUT=${1:-runs/demo-seeds-$(date +%Y%m%d-%H%M%S)}
SEEDS=${SEEDS:-0 1 2}
BASELINES=${BASELINES:-real simulator}
read -r -a sets <<< "${SETS:-}"
mkdir -p "$OUT"
echo "machine: $(nproc) cores, $(python -c 'import torch; print("torch", torch.__version__)'), $(date -Iseconds)" | tee "$OUT/machine.txt"
one_seed() {
  local s=$1
  envace train --config configs/demo.yaml --set seed="$s" --set threads=1 --set out="$OUT/rehearsal-s$s" "${sets[@]}" > "$OUT/rehearsal-s$s.log" 2>&1
  local run
  run=$(ls -d "$OUT/rehearsal-s$s"/train-* | head -n 1)
  for src in $BASELINES; do
    envace train --config configs/demo.yaml --source "$src" --set seed="$s" --set threads=1 \
      --set sft.init_from="$run/sft" --set out="$OUT/$src-s$s" "${sets[@]}" > "$OUT/$src-s$s.log" 2>&1
  done
  echo "seed $s done ($(date -Iseconds))"
}
pids=()
for s in $SEEDS; do
  if [ "${PARALLEL:-0}" = 1 ]; then one_seed "$s" & pids+=($!); else one_seed "$s"; fi
done
for p in "${pids[@]}"; do wait "$p"; done
runs=()
for src in rehearsal $BASELINES; do runs+=("$OUT/$src"-s*/train-*); done
python "$(dirname "$0")/eval_gain.py" "${runs[@]}" --plot "$OUT/by_source.png" | tee "$OUT/gains.md"

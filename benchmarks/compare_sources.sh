#!/usr/bin/env bash
# Issue #3's comparison: one SFT warm start, then the same GRPO budget with each response source
# (rehearsal = the method, real = RL against the executable worlds, simulator = a frozen copy of
# the warm start answering), evaluated in the real world on the same held-out tasks; one plot.
#   bash benchmarks/compare_sources.sh [CONFIG] [OUT]      (default configs/compare.yaml, runs/compare-<date>)
# SOURCES="real rehearsal" limits the sources; PARALLEL=1 runs them side by side (one thread each);
# SFT=<run>/sft reuses a warm start instead of training one; SETS="--set rl_pool=8 ..." adds
# overrides to every training run, e.g. the RL fit check (docs/results.md):
#   SFT=OUT/sft/sft-*/sft SOURCES="real rehearsal" SETS="--set rl_pool=8 --set steps=30 --set eval.every=0" \
#     bash benchmarks/compare_sources.sh configs/compare.yaml OUT-fit
set -euo pipefail
CONFIG=${1:-configs/compare.yaml}
OUT=${2:-runs/compare-$(date +%Y%m%d-%H%M%S)}
SOURCES=${SOURCES:-rehearsal real simulator}
mkdir -p "$OUT"
echo "machine: $(nproc) cores, $(python -c 'import torch; print("torch", torch.__version__)'), $(date -Iseconds)" | tee "$OUT/machine.txt"
start=$(date +%s)
if [ -z "${SFT:-}" ]; then
  envace sft --config "$CONFIG" --set out="$OUT/sft" | tee "$OUT/sft.log"
  SFT=$(ls -d "$OUT"/sft/*/sft | head -n 1)
fi
read -r -a sets <<< "${SETS:-}"
echo "warm start: $SFT ($(( $(date +%s) - start )) s)" | tee -a "$OUT/machine.txt"
pids=()
for src in $SOURCES; do
  if [ "${PARALLEL:-0}" = 1 ]; then
    envace train --config "$CONFIG" --source "$src" --set out="$OUT/$src" --set sft.init_from="$SFT" \
      --set threads=1 "${sets[@]}" > "$OUT/$src.log" 2>&1 &
    pids+=($!)
  else
    envace train --config "$CONFIG" --source "$src" --set out="$OUT/$src" --set sft.init_from="$SFT" \
      "${sets[@]}" 2>&1 | tee "$OUT/$src.log"
  fi
done
for p in "${pids[@]}"; do wait "$p"; done
echo "total: $(( $(date +%s) - start )) s" | tee -a "$OUT/machine.txt"
envace report "$OUT"/*/train-* --compare "$OUT/curves.png"

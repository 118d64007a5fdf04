#!/usr/bin/env bash
# The SmolLM2 comparison on one GPU in one command (issue #20): one SFT warm start, then the same
# GRPO budget with each response source (rehearsal, real, simulator), the real-world eval of the
# held-out tasks, and the paired table of gains (benchmarks/eval_gain.py).
#
#   bash benchmarks/gpu_check.sh [MODEL] [OUT]
#
# MODEL: smollm2 (default) or any local Hugging Face model directory (e.g. /models/Qwen3-1.7B).
# CONFIG=configs/smollm2_cpu.yaml by default; SETS="--set steps=20 ..." adds overrides to every
# run (the CPU test runs it at a tiny size this way); DEVICE=auto (cuda when torch sees one);
# DTYPE=bfloat16|float32 sets rollout.dtype (rollouts and evals from a bf16 copy of the policy) and
# PRECISION=bf16|no sets mixed_precision (the SFT and GRPO forward in bf16 autocast); unset, the
# config's own values hold.
# Prints the table and writes OUT/table.md, OUT/curves.png and each run's directory.
set -euo pipefail
MODEL=${1:-smollm2}
OUT=${2:-runs/gpu-check-$(date +%Y%m%d-%H%M%S)}
CONFIG=${CONFIG:-configs/smollm2_cpu.yaml}
DEVICE=${DEVICE:-auto}
read -r -a sets <<< "${SETS:-}"
common=(--config "$CONFIG" --set model="$MODEL" --set device="$DEVICE")
[[ -n "${DTYPE:-}" ]] && common+=(--set rollout.dtype="$DTYPE")
[[ -n "${PRECISION:-}" ]] && common+=(--set mixed_precision="$PRECISION")
common+=("${sets[@]}")
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1
python - <<'EOF' | tee "$OUT/machine.txt"
import platform, torch
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
print(f"machine: {platform.node()} {gpu}, torch {torch.__version__}, python {platform.python_version()}")
EOF
start=$(date +%s)
# Rehearsal first: its step-0 eval is the warm start's figure the other sources pair with.
envace train "${common[@]}" --set out="$OUT/rehearsal" 2>&1 | tee "$OUT/rehearsal.log"
BASE=$(ls -d "$OUT"/rehearsal/train-* | head -n 1)
for src in real simulator; do
  envace train "${common[@]}" --source "$src" --set out="$OUT/$src" --set sft.init_from="$BASE/sft" \
    --set eval.at_start=false 2>&1 | tee "$OUT/$src.log"
done
echo "wall: $(( $(date +%s) - start )) s" | tee -a "$OUT/machine.txt"
python "$(dirname "$0")/eval_gain.py" "$BASE" "$OUT"/real/train-* "$OUT"/simulator/train-* --start "$BASE" \
  | tee "$OUT/table.md"
envace report "$BASE" "$OUT"/real/train-* "$OUT"/simulator/train-* --compare "$OUT/curves.png" > /dev/null
echo "table: $OUT/table.md; curves: $OUT/curves.png"

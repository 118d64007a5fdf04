#!/usr/bin/env bash
# More world-model data for an existing warm start (issue #20): the SmolLM2 warm start imagines
# shop's search results and cart lines wrong and never answers an unknown id with an error, and
# rehearsal RL moves each template the way that fidelity points. This trains the warm start's own
# adapter on, simulator role only, in two stages, and measures fidelity after each:
#
#   bash benchmarks/world_model_data.sh WARM_RUN [OUT_DIR] [FIDELITY_TASKS] [CONFIG]
#
# 1. `sim`: simulator samples of all 128 oracle trajectories (the config's warm start gave 32);
# 2. `probes`: on top of 1, 64 trajectories' simulator samples plus one error probe each
#    (sft.error_probes=1: a call with a plausible missing id, the real error as target), 1 epoch.
# Fidelity: `envace eval --fidelity` on FIDELITY_TASKS test tasks per world, greedy, for the warm
# start and both stages (its own probes use 99999 ids, unlike the training probes). SETS="--set k=v ..."
# adds overrides to both training stages (the CPU test runs it at a tiny size this way).
set -euo pipefail
WARM=${1:?usage: world_model_data.sh WARM_RUN [OUT_DIR] [FIDELITY_TASKS] [CONFIG]}
OUT=${2:-runs/world-model-data}
TASKS=${3:-10}
CONFIG=${4:-configs/smollm2_cpu.yaml}
SETS=${SETS:-}
export HF_HUB_OFFLINE=1
latest() { ls -d "$1"/train-* | sort | tail -1; }
if [ ! -d "$OUT/sim" ]; then
    envace train --config "$CONFIG" --set model="$WARM/sft/step-00000000" --set 'sft.roles=[simulator]' \
        --set sft.simulator_trajectories=null --set steps=0 --set eval.at_start=false --set threads=1 --set out="$OUT/sim" $SETS
fi
SIM=$(latest "$OUT/sim")
if [ ! -d "$OUT/probes" ]; then
    envace train --config "$CONFIG" --set model="$SIM/sft/step-00000000" --set 'sft.roles=[simulator]' \
        --set sft.trajectories=64 --set sft.simulator_trajectories=null --set sft.error_probes=1 --set sft.epochs=1 --set sft.micro_batch_tokens=2048 \
        --set steps=0 --set eval.at_start=false --set threads=1 --set out="$OUT/probes" $SETS
fi
PROBES=$(latest "$OUT/probes")
for pair in "warm:$WARM" "sim:$SIM" "probes:$PROBES"; do
    name=${pair%%:*}; run=${pair#*:}
    [ -f "$OUT/fidelity/$name/summary.md" ] && continue
    envace eval --model "$run/sft/step-00000000" --fidelity --tasks "$TASKS" --threads 1 --seed 0 \
        --out "$OUT/fidelity" --name "$name"
done
for name in warm sim probes; do
    echo "## $name"; grep -E "^\| (oracle|probe) \| [a-z]+ \| [0-9]" "$OUT/fidelity/$name/summary.md" | head -6
done

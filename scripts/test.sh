#!/usr/bin/env bash
# Sets everything up, then runs every test: the C++ core (GoogleTest via
# CTest) and the Python API with real processes (pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}

echo "== C++ tests"
ctest --test-dir build/py --output-on-failure
echo "== Python tests"
# Run from tests/ so that `import batchcast` is the installed package.
$PY -m pytest -q -p no:cacheprovider tests/python "$@"

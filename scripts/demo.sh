#!/usr/bin/env bash
# Sets everything up and runs the demo: one producer over a synthetic image
# pipeline and three training processes with different batch sizes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${PYTHON:-python3}" examples/demo.py "$@"

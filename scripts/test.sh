#!/usr/bin/env bash
# The test command: sets everything up, builds batchcast into this Python,
# then runs its tests: the C++ core's (GoogleTest via CTest) and the Python
# API's, command line's and examples' with real processes (pytest; the GPU
# path on a simulated device). What a newcomer runs after cloning:
#
#   bash scripts/test.sh [pytest arguments]
#
# CI runs this, then scripts/long-checks.sh: the portable wheels for every
# Python, the sdist, the sanitizers, fuzzing, the mutants, a second torch,
# Ray, the doors' oldest versions and the types.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/steps.sh
STEPS_TITLE="scripts/test.sh, time per step"
trap steps_finish EXIT
PY=${PYTHON:-python3}

# Each step's budget (seconds) is what it took on a 2-CPU machine from a fresh
# clone, with some room (2026-12-07: 289, 9, 10 and 760 s): a step over it
# prints a WARNING in the summary.
step "Set-up: apt and pip packages, batchcast built into $PY" 420
# batchcast's own code builds without a warning (-Wall -Wextra) or not at all.
BATCHCAST_WERROR=${BATCHCAST_WERROR:-ON} bash scripts/setup.sh

step "The examples' packages (tests/constraints.txt)" 120
# What the examples' tests need (the notebook, the Optuna sweeps, tqdm, the
# Lightning and Accelerate examples, the Hugging Face Trainer door, Pillow for
# the augmentation sweep's JPEGs), at the pinned versions, with the installed
# torch held so that nothing pulls another.
pin=$(mktemp)
echo "torch==$($PY -c 'from importlib.metadata import version; print(version("torch"))')" >"$pin"
PIP_CONSTRAINT="$pin" $PY -m pip install -q -c tests/constraints.txt nbclient nbformat ipykernel \
  jupyter_client optuna tqdm lightning accelerate transformers pillow
rm -f "$pin"

step "C++ tests (build/py)" 60
ctest --test-dir build/py --output-on-failure

step "Python tests" 960
# `import batchcast` is the build just installed (python/ is not on sys.path).
# The GPU ring's rules run on the simulated device with two fixed seeds and a
# new one each run (a failing test's name shows its seed).
export BATCHCAST_SIMULATED_SEEDS=${BATCHCAST_SIMULATED_SEEDS:-1,2,$((RANDOM + 3))}
echo "   simulated-device seeds: $BATCHCAST_SIMULATED_SEEDS"
# Two test processes (pytest-xdist; BATCHCAST_TEST_WORKERS sets how many, 0:
# one): a test spends much of its time waiting for its producers and
# consumers, which start as forks of tests/python/launcher.py, not as new
# interpreters that each import torch.
workers=${BATCHCAST_TEST_WORKERS:-2}
xdist=()
[ "$workers" = 0 ] || xdist=(-n "$workers")
$PY -m pytest -q -p no:cacheprovider "${xdist[@]}" --durations=25 tests/python "$@"

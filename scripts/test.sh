#!/usr/bin/env bash
# Sets everything up, then runs every test: the C++ core (GoogleTest via
# CTest, then again under ASan+UBSan and TSan, with Python tests on the ASan
# build), fuzz runs of the decoder and of a mailbox queue's reader, the
# Python API, command line and examples with real processes (pytest, on the
# portable wheel built and checked first; the GPU path on a simulated device),
# the mutants (GPU path, slot ledger, join plan, re-padding, the strided copy), the package's types, the portable pip wheel
# on its own (and the command line's start-up time), that wheel under a second torch release, and the sdist.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step says its name and time; a failure's last lines name the step.
step_name="set-up"
step_started=$SECONDS
step_times=()
step() {
  step_times+=("$(printf '%5d s  %s' $((SECONDS - step_started)) "$step_name")")
  step_name=$1
  step_started=$SECONDS
  echo "== $1"
}
finish() {
  local status=${1:-$?}
  step_times+=("$(printf '%5d s  %s' $((SECONDS - step_started)) "$step_name")")
  echo "== time per step:"
  printf '   %s\n' "${step_times[@]}"
  if [ "$status" -ne 0 ]; then
    echo "== FAILED in step: $step_name (exit status $status)"
  else
    echo "== every step passed in $SECONDS s"
  fi
}
trap finish EXIT

# batchcast's own code builds without a warning (-Wall -Wextra) or not at all.
BATCHCAST_WERROR=${BATCHCAST_WERROR:-ON} bash scripts/setup.sh
PY=${PYTHON:-python3}

step "Test tools (clang for the fuzzers; the examples' packages)"
# The decoder fuzz target needs clang and its libFuzzer runtime.
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if ! dpkg -s clang libclang-rt-dev >/dev/null 2>&1; then
  echo "== apt-get install clang libclang-rt-dev"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang libclang-rt-dev >/dev/null
fi

# What the examples' tests need (the notebook, the Optuna sweep, tqdm, the
# Lightning and Accelerate examples, the Hugging Face Trainer door's tests,
# Pillow for the augmentation sweep's JPEGs), with the installed torch pinned
# so that nothing pulls another.
pin=$(mktemp)
echo "torch==$($PY -c 'import torch; print(torch.__version__.split("+")[0])')" > "$pin"
PIP_CONSTRAINT="$pin" $PY -m pip install -q nbclient nbformat ipykernel jupyter_client optuna tqdm \
  lightning accelerate transformers pillow
rm -f "$pin"

step "C++ tests"
ctest --test-dir build/py --output-on-failure
step "Sanitizers: the C++ tests under ASan+UBSan and under TSan; producers and consumers in real processes on the ASan build"
bash scripts/sanitizers.sh all
step "Fuzzing the message decoder and a mailbox queue's reader (${BATCHCAST_FUZZ_SECONDS:-30} s each)"
bash tests/fuzz/run.sh "${BATCHCAST_FUZZ_SECONDS:-30}"
step "Wheel: portable (built in Debian 11: glibc 2.31, GCC 10), pip alone, the older C++ runtime"
bash scripts/wheel-check.sh
# The Python suite runs on that very wheel file (one wheel for every torch:
# this one, 2.13.0, the whole suite; 2.14.1 the capability set, below), in
# place of the build installed by the set-up (whose C++ tests ran above).
wheel=$(ls -t dist/batchcast-*.whl | sed -n 1p)
$PY -m pip install -q --force-reinstall --no-deps "$wheel"
step "Python tests (on the wheel $(basename "$wheel"))"
# `import batchcast` is the wheel just installed (python/ is not on sys.path).
# The GPU ring's rules run on the simulated device with two fixed seeds and a
# new one each run (a failing test's name shows its seed).
export BATCHCAST_SIMULATED_SEEDS=${BATCHCAST_SIMULATED_SEEDS:-1,2,$((RANDOM + 3))}
echo "   simulated-device seeds: $BATCHCAST_SIMULATED_SEEDS"
$PY -m pytest -q -p no:cacheprovider tests/python "$@"
# Shared memory in 2 MiB pages is off by default on most systems
# (transparent_hugepage/shmem_enabled "never"), so the suite above skipped its
# test; where this may switch it (root), that test runs with it on, and the
# setting is put back.
thp=/sys/kernel/mm/transparent_hugepage/shmem_enabled
if [ -w "$thp" ]; then
  step "Huge pages: the ring in 2 MiB pages (shmem_enabled advise for this test)"
  was=$(sed -n 's/.*\[\(.*\)\].*/\1/p' "$thp")
  echo advise >"$thp"
  trap 'st=$?; echo "$was" >"$thp"; finish $st' EXIT
  BATCHCAST_REQUIRE_HUGE_PAGES=1 $PY -m pytest -q -p no:cacheprovider tests/python/test_api.py \
    -k huge_pages
  echo "$was" >"$thp"
  trap finish EXIT
fi
step "Ray: one producer per node on a local multi-node cluster (pytest -m ray)"
$PY -m pip install -q "ray[tune]==2.60.0"
$PY -m pytest -q -p no:cacheprovider -m ray tests/python/test_ray.py tests/python/test_examples.py
step "The same wheel under a second torch (2.14.1, a CUDA build on the CPU): the capability set (pytest -m every_torch)"
# One wheel for every torch from the floor (2.11) on: the wheel just checked,
# installed beside another torch release, runs every capability once.
bash scripts/torch-versions.sh "$(ls -t dist/batchcast-*.whl | sed -n 1p)" "${BATCHCAST_SECOND_TORCH:-2.14.1}"
step "Mutants: each deliberate bug (GPU path on the simulated device, slot ledger, join plan, re-padding, the strided copy, sample identities, a view over several ring slots) is caught by a test"
$PY tests/mutations/run.py
step "Types: mypy --strict on the package (with the stubs of its compiled modules)"
$PY -m pip install -q "mypy==2.4.1"
$PY -m mypy --strict --no-incremental python/batchcast
step "sdist: pip builds it against the installed torch, or stops at once naming the command; it builds in a Debian root with a compiler, CMake and torch alone"
bash scripts/sdist-check.sh

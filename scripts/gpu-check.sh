#!/usr/bin/env bash
# The GPU check, on a machine with an NVIDIA GPU and torch (normally a CUDA
# build of it): builds batchcast against that torch with CMake + Ninja (no pip,
# no network, no nvcc: CMake takes the CUDA runtime torch itself uses), then
# runs, each under its own timeout,
#   the C++ tests (ctest, the simulated device's included), the GPU tests
#   (tests/python/test_gpu.py, and test_gpu_rules.py on the GPU: the
#   race-revealing ones), the CPU API tests (tests/python/test_api.py), the
#   GPU benchmark and what a trainer pays per batch here (wakeup.py and
#   compare.py's overhead experiment, the last 100 s),
# and writes everything under OUT_DIR (default: gpu-results/), with a short
# summary.txt: the set-up, one line per test, the benchmark's table, and the
# time each step took. Tests come first, each suite with its own timeout; the
# benchmark gets what is left of BUDGET_S seconds (default 540), and a
# benchmark cut short is reported as such, never as a failed test.
#
#   bash scripts/gpu-prepare.sh                      # where a registry is: ZeroMQ etc.
#   source .device/unpack.sh && bash scripts/gpu-check.sh OUT_DIR
#
# Exit status: 0 every test passed on a GPU; 1 a build step or a test failed;
# 2 nothing failed but no GPU was visible (the GPU tests skipped). The
# benchmark's outcome is in summary.txt; it never changes the status.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(mkdir -p "${1:-gpu-results}" && cd "${1:-gpu-results}" && pwd)
PY=$(command -v "${PYTHON:-python3}") || { echo "no ${PYTHON:-python3}" >&2; exit 1; }
BUDGET_S=${BUDGET_S:-540}
BUILD=build/gpu
STAGE=$BUILD/stage
SUMMARY=$OUT/summary.txt
failed=0
gpu=0
: > "$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
timings=()
step_started=0
step_name=""
# Closes the previous step's timing and opens the next one.
step() {
  [ -n "$step_name" ] && timings+=("$(printf '%-34s %4ds' "$step_name" $((SECONDS - step_started)))")
  step_name=$1
  step_started=$SECONDS
  echo
  say "== $* [${SECONDS}s]"
}
fail() { failed=1; say "FAILED: $*"; }
# Seconds a step may take: its own cap, less whatever would overrun the budget
# (keeping $2 seconds for what must still follow).
allot() {
  local left=$((BUDGET_S - SECONDS - ${2:-0}))
  left=$(( left < 0 ? 0 : left ))
  echo $(( left < $1 ? left : $1 ))
}
# One line per test from pytest's JUnit XML; from its -v lines if it was cut short.
pytest_lines() {
  "$PY" - "$1" "$2" <<'PYEOF'
import os, re, sys
import xml.etree.ElementTree as ET
xml, log = sys.argv[1:]
counts = {}
if os.path.exists(xml) and os.path.getsize(xml):
    for case in ET.parse(xml).getroot().iter("testcase"):
        status, detail = "PASS", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = {"failure": "FAIL", "error": "ERROR", "skipped": "SKIP"}[child.tag]
                detail = (child.get("message") or "").strip().splitlines()
                detail = detail[0][:200] if detail else ""
        counts[status] = counts.get(status, 0) + 1
        name = case.get("classname", "").split(".")[-1] + "::" + case.get("name", "")
        print(f"  {status:5s} {name} ({float(case.get('time') or 0):.1f}s)" + (f": {detail}" if detail else ""))
else:  # killed by its timeout: what the verbose log shows
    print("  (no JUnit report: the run was cut short; from the log)")
    for line in open(log, errors="replace"):
        m = re.match(r"(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)", line)
        if m:
            status = {"PASSED": "PASS", "FAILED": "FAIL", "SKIPPED": "SKIP"}.get(m.group(2), m.group(2))
            counts[status] = counts.get(status, 0) + 1
            print(f"  {status:5s} {m.group(1)}")
print("  total: " + (", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no test ran"))
PYEOF
}
pytest_suite() {  # pytest_suite LABEL CAP_S RESERVE_S FILES...
  local label=$1 cap=$2 reserve=$3; shift 3
  local t; t=$(allot "$cap" "$reserve")
  step "pytest $label (timeout ${t}s)"
  if [ "$t" -lt 20 ]; then fail "$label: no time left"; return; fi
  local extra=()
  "$PY" -c "import pytest_timeout" 2> /dev/null && extra+=(--timeout 120)
  timeout -k 10 "$t" "$PY" -m pytest -p no:cacheprovider -v -rA "${extra[@]}" \
    --junitxml="$OUT/pytest-$label.xml" "$@" > "$OUT/pytest-$label.txt" 2>&1
  local rc=$?
  pytest_lines "$OUT/pytest-$label.xml" "$OUT/pytest-$label.txt" | tee -a "$SUMMARY"
  case $rc in
    0) ;;
    124|137) fail "$label: timed out after ${t}s (see pytest-$label.txt)" ;;
    *) fail "$label: pytest exited $rc (see pytest-$label.txt)" ;;
  esac
}

step "machine"
{
  date -Is
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv
  else
    echo "nvidia-smi: not found"
  fi
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
  echo "python $PY, $(nproc) cores"
} > "$OUT/machine.txt" 2>&1
tee -a "$SUMMARY" < "$OUT/machine.txt"

step "configure and build"
cmake_args=(-S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$PY"
            -DBATCHCAST_WITH_CUDA=ON)
# CUDA's pip runtime wheel lacks the crt/ headers that cuda_runtime_api.h
# includes: scripts/gpu-prepare.sh carries the nvidia-cuda-crt wheel of torch's
# CUDA version (headers only). CMake uses it only where torch's own CUDA
# headers lack crt/.
torch_cuda=$("$PY" -c "import torch; print(torch.version.cuda or '')" 2> /dev/null)
crt_wheel=$(ls .device/wheels/nvidia_cuda_crt-"$torch_cuda".*.whl 2> /dev/null | tail -1)
if [ -n "$torch_cuda" ] && [ -n "$crt_wheel" ]; then
  rm -rf "$BUILD/cuda-crt" && mkdir -p "$BUILD/cuda-crt"
  "$PY" -m zipfile -e "$crt_wheel" "$BUILD/cuda-crt"
  crt=$(dirname "$(dirname "$(find "$PWD/$BUILD/cuda-crt" -path '*/crt/host_defines.h' -print -quit)")")
  [ "$crt" != . ] && cmake_args+=(-DBATCHCAST_CUDA_CRT_INCLUDE_DIR="$crt")
fi
configure() {
  rm -f "$BUILD/CMakeCache.txt"
  timeout -k 10 120 cmake "${cmake_args[@]}" -DBATCHCAST_BUILD_TESTS="$1" > "$OUT/configure.txt" 2>&1
}
tests=ON
if ! configure ON; then
  say "configure with the C++ tests failed (see configure.txt); again without them"
  tests=OFF
  if ! configure OFF; then
    fail "configure (see configure.txt)"
    tail -30 "$OUT/configure.txt"
    say "== done: FAILED at configure [${SECONDS}s]"
    exit 1
  fi
fi
grep -E "^-- batchcast:" "$OUT/configure.txt" | sed 's/^-- /  /' | tee -a "$SUMMARY"
if ! timeout -k 10 300 cmake --build "$BUILD" -j "$(nproc)" > "$OUT/build.txt" 2>&1; then
  fail "build (see build.txt)"
  grep -E -A3 "error|Error" "$OUT/build.txt" | head -40 | tee -a "$SUMMARY"
  say "== done: FAILED at build [${SECONDS}s]"
  exit 1
fi
rm -rf "$STAGE" && mkdir -p "$STAGE"
cp -r python/batchcast "$STAGE/"
rm -rf "$STAGE"/batchcast/_C*.so "$STAGE"/batchcast/__pycache__  # never an older in-place build
cp "$BUILD"/_C*.so "$STAGE/batchcast/"
export PYTHONPATH="$PWD/$STAGE${PYTHONPATH:+:$PYTHONPATH}"
say "built after ${SECONDS}s"

step "import"
# One CUDA runtime in the process, torch's: list every libcudart mapped.
if "$PY" > "$OUT/import.txt" 2>&1 <<'PYEOF'
import batchcast as bc, torch
cudart = sorted({l.split(None, 5)[5].strip() for l in open("/proc/self/maps")
                 if len(l.split(None, 5)) == 6 and "libcudart" in l})
print("batchcast", bc.__version__, "from", bc.__file__)
print("cuda_available", bc.cuda_available(), "| torch.cuda.is_available", torch.cuda.is_available())
print("libcudart mapped:", ", ".join(cudart) or "none (static)")
assert len(cudart) <= 1, "more than one libcudart in the process"
PYEOF
then
  sed 's/^/  /' "$OUT/import.txt" | tee -a "$SUMMARY"
else
  sed 's/^/  /' "$OUT/import.txt" | tail -20 | tee -a "$SUMMARY"
  fail "import batchcast"
  say "== done: FAILED at import [${SECONDS}s]"
  exit 1
fi
if "$PY" -c "import batchcast as bc, sys; sys.exit(not bc.cuda_available())" 2> /dev/null; then
  gpu=1
else
  say "NO GPU visible to batchcast: the GPU tests skip and the benchmark does not run"
fi

if [ "$tests" = ON ]; then
  t=$(allot 90 200)
  step "C++ tests (ctest, timeout ${t}s)"
  if [ "$t" -lt 10 ]; then
    fail "ctest: no time left"
  else
    (cd "$BUILD" && timeout -k 10 "$t" ctest -V --timeout 60) > "$OUT/ctest.txt" 2>&1 || fail "ctest (see ctest.txt)"
  fi
  grep -E "Test +#[0-9]+:" "$OUT/ctest.txt" 2> /dev/null | sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: /  /; s/ \.{2,} */: /' | tee -a "$SUMMARY"
  grep -E "tests passed|tests failed" "$OUT/ctest.txt" 2> /dev/null | sed 's/^/  /' | tee -a "$SUMMARY"
  # A skipped GoogleTest still counts as passed for ctest: name the skips.
  grep -E "^[0-9]+: \[  SKIPPED \] [A-Za-z].* ms\)$" "$OUT/ctest.txt" 2> /dev/null | sed -E 's/^[0-9]+: /  /' | tee -a "$SUMMARY"
fi

# The GPU tests: test_gpu.py, and the rules of test_gpu_rules.py on the GPU
# (their simulated-device runs are CI's), the transform's side stream and the
# decoded cache served into a GPU ring.
pytest_suite gpu 240 150 tests/python/test_gpu.py tests/python/test_gpu_rules.py tests/python/test_transform.py \
  tests/python/test_cache.py::test_a_gpu_ring_is_served_from_the_cache_through_its_pinned_mirror -k "not simulated"
pytest_suite api 120 60 tests/python/test_api.py

t=$(allot 400 100)  # 100 s stay for the trainer-overhead step after it
step "GPU benchmark (timeout ${t}s)"
benchmark="not run"
if [ "$gpu" = 0 ]; then
  say "  skipped: no GPU"
elif [ "$t" -lt 60 ]; then
  say "  not run: ${t}s left of BUDGET_S=${BUDGET_S}"
else
  bench=(--out "$OUT/gpu.json" --run-timeout $((t / 4)))
  [ "$t" -lt 300 ] && bench+=(--consumers 1 4)  # 6 runs instead of 9
  timeout -k 10 "$t" "$PY" benchmarks/gpu.py "${bench[@]}" > "$OUT/benchmark.txt" 2>&1
  case $? in
    0) benchmark="complete" ;;
    124|137) benchmark="cut short after ${t}s (its partial results below)" ;;
    *) benchmark="failed (see benchmark.txt)" ;;
  esac
  say "  benchmark: $benchmark"
  if grep -q "^Samples/s" "$OUT/benchmark.txt"; then
    sed -n '/^Samples\/s/,$p' "$OUT/benchmark.txt" | tee -a "$SUMMARY"
  elif [ -s "$OUT/gpu.json" ]; then  # cut short: the configurations it finished
    "$PY" - "$OUT/gpu.json" <<'PYEOF' | tee -a "$SUMMARY"
import json, sys
r = json.load(open(sys.argv[1]))
print("partial results (samples/s, median [min, max]):")
for key, t in r["table"].items():
    print(f"  {key:12s} {t['median']:8.0f} [{t['min']:.0f}, {t['max']:.0f}]")
for e in r["errors"]:
    print("  FAILED:", e)
PYEOF
  else
    tail -15 "$OUT/benchmark.txt" | tee -a "$SUMMARY"
  fi
fi

# What a trainer pays per batch on this machine (many cores), which a small VM
# cannot show: the wake-up floor (wakeup.py) and compare.py's overhead
# experiment (a 20 ms step; target: under 60 us of CPU beyond a plain loop).
t=$(allot 100 5)
step "trainer overhead (timeout ${t}s)"
if [ "$t" -lt 30 ]; then
  say "  not run: ${t}s left of BUDGET_S=${BUDGET_S}"
else
  timeout -k 5 $((t * 2 / 5)) "$PY" benchmarks/wakeup.py --reps 200 --out "$OUT/wakeup.md" \
    > "$OUT/wakeup.txt" 2>&1 || say "  wakeup.py: cut short or failed (see wakeup.txt)"
  [ -s "$OUT/wakeup.md" ] && grep -E "^\| (back to back|sleep 20 ms)" "$OUT/wakeup.md" | sed 's/^/  wakeup: /' | tee -a "$SUMMARY"
  timeout -k 5 $((t * 3 / 5 - 5)) "$PY" benchmarks/compare.py --experiments overhead \
    --systems batchcast dataloader --repeats 2 --overhead-batches 200 --out "$OUT/overhead" \
    > "$OUT/overhead.txt" 2>&1 || say "  compare.py overhead: cut short or failed (see overhead.txt)"
  [ -s "$OUT/overhead/compare.md" ] && grep -E "beyond a plain loop|^\| (plain loop|batchcast|dataloader) \|" \
    "$OUT/overhead/compare.md" | sed 's/^/  overhead: /' | tee -a "$SUMMARY"
fi

status=$failed
[ "$failed" = 0 ] && [ "$gpu" = 0 ] && status=2
step "timings"
for line in "${timings[@]}"; do say "  $line"; done
case $status in
  0) step "done: every test PASSED on the GPU; benchmark: $benchmark" ;;
  1) step "done: FAILED (see above); benchmark: $benchmark" ;;
  2) step "done: no GPU visible; everything that ran without one passed (status 2)" ;;
esac
exit $status

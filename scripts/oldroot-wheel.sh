#!/usr/bin/env bash
# Builds the batchcast wheels, one per CPython, with the older root's compiler
# and libraries (scripts/oldroot.sh: Debian 11, glibc 2.31, GCC 10) while pip,
# CMake and the Pythons stay this machine's:
#
#   bash scripts/oldroot-wheel.sh ROOT OUT_DIR BUILD_DIR PYTHON...
#
# PYTHON: interpreters (paths), the first one with torch installed: every
# wheel is built against that torch (BATCHCAST_TORCH_PYTHON), whose headers
# and stable ABI are the same whatever the Python. The wheels share one build
# folder, so the core (csrc/batchcast, no Python in it) is compiled once, for
# the first, and only the binding (csrc/batchcast/python) again for each other
# Python: CMake is configured anew for each, and Ninja rebuilds what that
# changes, nothing else (checked: the core's objects must not be recompiled).
# The other Pythons build in a venv of their own under BUILD_DIR/pythons with
# Ninja (tests/constraints.txt's, as this Python has it: another Ninja
# release would read the build log as foreign and rebuild everything), no
# torch; one scikit-build-core serves them all (below).
#
# Every compile and link runs in ROOT (chroot, GCC 10 and its libstdc++,
# glibc 2.31), so the modules need no newer symbol versions than those.
# What the compiler reads from this machine (the source, the build folder,
# each Python's headers, torch, the CUDA toolkit) is bind-mounted into ROOT at
# the same paths, in a private mount namespace that is gone when the build
# ends. libzmq is ROOT's static one. Needs root (or sudo) for unshare and chroot.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 4 ] || { echo "usage: $0 ROOT OUT_DIR BUILD_DIR PYTHON..." >&2; exit 2; }
root=$(realpath "$1")
out=$(realpath -m "$2")
build=$(realpath -m "$3")
shift 3
pythons=("$@")
torch_py=${pythons[0]}
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
[ -f "$root/opt/zmq/lib/libzmq.a" ] || { echo "oldroot-wheel: run scripts/oldroot.sh $root first" >&2; exit 1; }
mkdir -p "$out" "$build"

# The build venv of each other Python: pip (one that knows -C) and Ninja.
builders=("$torch_py")
for py in "${pythons[@]:1}"; do
  tag=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  venv=$build/pythons/$tag
  if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv "$venv"
  fi
  "$venv/bin/python" -m pip install -q -c tests/constraints.txt pip ninja >"$build/pip-$tag.log" 2>&1 ||
    { cat "$build/pip-$tag.log" >&2; exit 1; }
  "$venv/bin/python" -m pip uninstall -q -y scikit-build-core >/dev/null 2>&1 || true  # the shared one below
  builders+=("$venv/bin/python")
done
# One scikit-build-core for every Python (it is pure Python), first on their
# PYTHONPATH: scikit-build-core clears a build folder that another copy of
# itself configured (CMakeFiles, with every object in it), as it would one
# made in another isolated environment. Installed by the oldest Python, so
# that what that one needs of its own (tomli) is there too.
skbuild=$build/pythons/scikit-build-core
oldest=$(for b in "${builders[@]}"; do "$b" -c 'import sys; print("%d.%03d" % sys.version_info[:2], sys.executable)'; done |
  sort | sed -n '1s/^[^ ]* //p')
if [ ! -f "$skbuild/scikit_build_core/__init__.py" ]; then
  rm -rf "$skbuild"
  "$oldest" -m pip install -q --target "$skbuild" -c tests/constraints.txt scikit-build-core >"$build/pip-skbuild.log" 2>&1 ||
    { cat "$build/pip-skbuild.log" >&2; exit 1; }
fi

# The folders the compiler must see, at their paths here.
mapfile -t mounts < <("$torch_py" - "$PWD" "$build" "$root/opt/zmq" "${pythons[@]}" <<'EOF'
import os, subprocess, sys
import torch
paths = set(sys.argv[1:4])
for py in sys.argv[4:]:
    paths.add(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
                             check=True, capture_output=True, text=True).stdout.strip())
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
# g++ of $root, run there in the caller's folder. The dependency file it
# writes (-MF) names the root's own headers as the root sees them
# (/usr/include/c++/10/...), which Ninja, outside it, would find missing or
# another's and so rebuild everything every time: they are renamed to their
# paths from here. (What is bind-mounted, the source, torch and /usr/local,
# has the same path on both sides.)
chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin LANG=C /bin/sh -c 'cd "\$0" && exec /usr/bin/g++ "\$@"' "\$PWD" "\$@" || exit
depfile=""
previous=""
for arg in "\$@"; do
  [ "\$previous" = -MF ] && depfile=\$arg
  previous=\$arg
done
[ -z "\$depfile" ] || sed -i -E 's#(^|[ ])/(usr/include|usr/lib|lib)/#\\1$root/\\2/#g' "\$depfile"
EOF
chmod +x "$wrapper"

cat >"$build/namespace.sh" <<'EOF'
# In a private mount namespace: bind the folders, build each wheel, and leave.
# Arguments: ROOT OUT BUILD WRAPPER TORCH_PYTHON BUILDER... -- MOUNT...
set -euo pipefail
root=$1 out=$2 build=$3 wrapper=$4 torch_py=$5
shift 5
builders=()
while [ "$1" != "--" ]; do builders+=("$1"); shift; done
shift
for d in "$@"; do
  mkdir -p "$root$d"
  mount --bind "$d" "$root$d"
done
mount -t proc proc "$root/proc"
core_objects() {  # the core's compiled objects: path and time stamp
  find "$build/cmake/CMakeFiles/batchcast_core.dir" "$build/cmake/CMakeFiles/batchcast_wire.dir" \
    -name '*.o' -printf '%P %T@\n' 2>/dev/null | sort || true  # none yet: the first build
}
first=1
for py in "${builders[@]}"; do
  found=$(PYTHONPATH=$skbuild "$py" -c 'import scikit_build_core, os; print(os.path.dirname(scikit_build_core.__file__))')
  [ "$found" = "$skbuild/scikit_build_core" ] ||
    { echo "oldroot-wheel: FAIL: $py builds with the scikit-build-core in $found, not $skbuild's" >&2; exit 1; }
  before=$(core_objects)
  started=$SECONDS
  PYTHONPATH=$skbuild BATCHCAST_TORCH_PYTHON="$torch_py" "$py" -m pip wheel --no-build-isolation --no-deps -w "$out" \
    -C build-dir="$build/cmake" \
    -C cmake.define.CMAKE_CXX_COMPILER="$wrapper" \
    -C cmake.define.BATCHCAST_TORCH_PYTHON="$torch_py" \
    -C cmake.define.BATCHCAST_BUILD_TESTS=OFF \
    -C cmake.define.ZMQ_INCLUDE_DIR="$root/opt/zmq/include" \
    -C cmake.define.CPPZMQ_INCLUDE_DIR="$root/opt/zmq/include" \
    -C cmake.define.ZMQ_LIBRARY="$root/opt/zmq/lib/libzmq.a" \
    -C build.verbose=false . >"$build/wheel.log" 2>&1 || { cat "$build/wheel.log" >&2; exit 1; }
  after=$(core_objects)
  version=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  if [ "$first" = 1 ]; then
    echo "   Python $version: the core and the binding, $((SECONDS - started)) s ($(grep -c . <<<"$after") core objects)"
  else
    if [ "$before" != "$after" ]; then
      echo "oldroot-wheel: FAIL: the wheel for Python $version recompiled the core:" >&2
      diff <(echo "$before") <(echo "$after") | head -5 >&2
      exit 1
    fi
    echo "   Python $version: the binding alone, $((SECONDS - started)) s (the core's objects reused)"
  fi
  first=0
done
EOF
$SUDO unshare -m env skbuild="$skbuild" bash "$build/namespace.sh" "$root" "$out" "$build" "$wrapper" "$torch_py" \
  "${builders[@]}" -- "${mounts[@]}"

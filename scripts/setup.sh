#!/usr/bin/env bash
# Installs what batchcast needs on a Debian machine (apt + pip) and builds it
# into the current Python: the extension with pip, the C++ tests with CMake.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# ccache: the builds after the first (the mutants', a rebuild after a pull)
# take what did not change from its cache.
apt_packages="libzmq3-dev cppzmq-dev libgtest-dev pkg-config cmake g++ ninja-build ccache"
missing=""
for p in $apt_packages; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "== apt-get install$missing"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

# torch: keep an installed one (the extension builds against it); otherwise
# take the CPU release this project is tested with.
if ! $PY -c "import torch" >/dev/null 2>&1; then
  echo "== pip install torch==2.13.0"
  $PY -m pip install -q "torch==2.13.0"
fi
# The build and test tools at the versions tests/constraints.txt pins (torch,
# installed above or before, held where it is).
pin=$(mktemp)
trap 'rm -f "$pin"' EXIT
echo "torch==$($PY -c 'from importlib.metadata import version; print(version("torch"))')" >"$pin"
PIP_CONSTRAINT="$pin" $PY -m pip install -q -c tests/constraints.txt \
  scikit-build-core ninja pytest pytest-xdist hypothesis numpy pyzmq click rich

echo "== building batchcast against torch $($PY -c 'import torch; print(torch.__version__)')"
# --no-build-isolation: build against the torch installed here, never a downloaded one.
# BATCHCAST_WERROR=ON (the test command sets it): a warning in batchcast's own
# code fails the build.
launcher=()
if command -v ccache >/dev/null; then
  # Paths below the tree are hashed relative to it (the mutants' copy of it
  # finds these objects), and the cache stays small.
  # -Werror changes no object, only whether a warning fails: out of the hash,
  # the mutants' build (tests/mutations/run.py, without it) finds these too.
  export CCACHE_BASEDIR=$PWD CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G} CCACHE_IGNOREOPTIONS=-Werror
  launcher=(-C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER="$(command -v ccache)")
fi
$PY -m pip install -q --no-build-isolation "${launcher[@]}" \
  -C build-dir=build/py -C cmake.define.BATCHCAST_BUILD_TESTS=ON \
  -C cmake.define.BATCHCAST_BUILD_EXAMPLES=ON -C cmake.define.BATCHCAST_WERROR="${BATCHCAST_WERROR:-OFF}" .

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
#      sdist (minutes), and a producer/consumer round trip runs.
#
#   bash scripts/sdist-check.sh      # when all pass, the sdist goes to dist/
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/batchcast-sdist.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
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
    tests/cpp/test_protocol.cpp; do
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
mkdir -p dist
mv -f "$sdist" dist/
echo "== sdist-check passed: dist/$(basename "$sdist")"

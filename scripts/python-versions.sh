#!/usr/bin/env bash
# Each portable wheel on its own Python: for every wheel in dist/ (or those
# given), a fresh venv of its CPython, a torch from the index (a CUDA build
# for any Python but this machine's 3.11: 2.7 GB to download, 5 GB
# installed, run on the CPU), the wheel, and the capability set
# (pytest -m every_torch), by scripts/torch-versions.sh. Then a table:
# Python, torch, tests passed/failed, seconds.
#
#   bash scripts/python-versions.sh [WHEEL...]          # default: dist/batchcast-*-cp3*.whl
#   BATCHCAST_TORCH=2.13.0 bash scripts/python-versions.sh  # the torch release (default: this Python's)
#
# Not part of CI (a torch per Python is GBs to download each run): run it
# before resolving anything that changes the binding, the build or the
# supported Pythons, and put its table in docs/install.md. Each interpreter
# is pyenv's X.Y, else pythonX.Y on PATH; a missing one fails, naming it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/pythons.sh
PY=${PYTHON:-python3}
torch_version=${BATCHCAST_TORCH:-$($PY -c 'from importlib.metadata import version; print(version("torch").split("+")[0])')}
if [ $# -gt 0 ]; then
  wheels=("$@")
else
  mapfile -t wheels < <(ls dist/batchcast-*-cp3*-cp3*-*.whl 2>/dev/null | sort)
fi
[ ${#wheels[@]} -gt 0 ] || { echo "python-versions: no wheel in dist/: run scripts/wheel-check.sh first" >&2; exit 1; }

rows=()
status=0
for wheel in "${wheels[@]}"; do
  tag=$(basename "$wheel" | cut -d- -f3)          # cp310
  version="${tag:2:1}.${tag:3}"                    # 3.10
  interpreter=$(find_python "$version")
  if [ -z "$interpreter" ]; then
    echo "python-versions: FAIL: no CPython $version here for $(basename "$wheel") (pyenv install $version)" >&2
    rows+=("$(printf '%-7s %-8s %s' "$version" "$torch_version" "FAILED: no interpreter")")
    status=1
    continue
  fi
  echo "== $(basename "$wheel") on $($interpreter -V 2>&1) ($interpreter), torch $torch_version"
  log=$(mktemp)
  started=$SECONDS
  if PYTHON=$interpreter bash scripts/torch-versions.sh "$wheel" "$torch_version" 2>&1 | tee "$log"; then
    result=passed
  else
    result=FAILED
    status=1
  fi
  # torch-versions.sh's table row: torch, install s, passed, failed, skipped, tests s, total s, result
  row=$(awk '/^== .* under each torch/ { table = 1; next } table && NR > 0 && $1 != "torch" { print; exit }' "$log")
  read -r torch_installed _ passed failed skipped tests_s _ _ <<<"$row"
  rows+=("$(printf '%-7s %-12s %7s %7s %8s %8s %8s  %s' "$version" "${torch_installed:--}" "${passed:--}" \
    "${failed:--}" "${skipped:--}" "${tests_s:--}" "$((SECONDS - started))" "$result")")
  rm -f "$log"
done
echo "== each wheel on its Python (pytest -m every_torch; seconds)"
printf '%-7s %-12s %7s %7s %8s %8s %8s  %s\n' Python torch passed failed skipped "tests s" "total s" result
printf '%s\n' "${rows[@]}"
[ "$status" = 0 ] || { echo "python-versions: FAIL: not every wheel passed on its Python (above)" >&2; exit 1; }
echo "== every wheel passed on its Python"

#!/usr/bin/env bash
# How trial processes end and fork (tests/python/test_endings.py and
# test_forks.py), N times in a row beside CPU hogs (one per core, so that
# every thread of batchcast's is preempted at unlucky moments), then once
# pinned to one core with the hogs on it too. Stops at the first failure.
#
#   bash scripts/endings-under-load.sh 20        # what the note's "20 in a row" ran
#
# Runs against the batchcast importable here (scripts/setup.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
PY=${PYTHON:-python3}
tests=(tests/python/test_endings.py tests/python/test_forks.py)

hogs=()
stop_hogs() { [ ${#hogs[@]} -eq 0 ] || kill "${hogs[@]}" 2>/dev/null || true; hogs=(); }
trap stop_hogs EXIT
start_hogs() {  # $1: how many, $2: a taskset CPU list or ""
  for _ in $(seq "$1"); do
    if [ -n "$2" ]; then taskset -c "$2" $PY -c 'while True: pass' & else $PY -c 'while True: pass' & fi
    hogs+=($!)
  done
}

cores=$(nproc)
start_hogs "$cores" ""
for run in $(seq "$runs"); do
  started=$SECONDS
  $PY -m pytest -q -p no:cacheprovider "${tests[@]}" >"/tmp/batchcast-endings-$run.log" 2>&1 || {
    tail -40 "/tmp/batchcast-endings-$run.log"
    echo "== run $run of $runs FAILED under load (log: /tmp/batchcast-endings-$run.log)"
    exit 1
  }
  echo "== run $run of $runs passed under load ($(tail -1 "/tmp/batchcast-endings-$run.log"), $((SECONDS - started)) s)"
done
stop_hogs
start_hogs 1 0
started=$SECONDS
taskset -c 0 $PY -m pytest -q -p no:cacheprovider "${tests[@]}" >/tmp/batchcast-endings-pinned.log 2>&1 || {
  tail -40 /tmp/batchcast-endings-pinned.log
  echo "== pinned to one core: FAILED (log: /tmp/batchcast-endings-pinned.log)"
  exit 1
}
echo "== pinned to one core, beside a hog there: passed ($(tail -1 /tmp/batchcast-endings-pinned.log), $((SECONDS - started)) s)"

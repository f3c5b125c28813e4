#!/usr/bin/env bash
# The C++ core and its tests under the sanitizers, each in a build folder of
# its own against the installed torch (nothing is installed into it):
#   bash scripts/sanitizers.sh [address|thread|python|all] [pytest arguments]
# address: ASan+UBSan, the GoogleTest binaries (build/asan) under CTest;
# thread:  TSan, the same (build/tsan);
# python:  the _C module of build/asan (built there with the tests), staged
#          with the package (build/asan-stage, first on PYTHONPATH, beside the
#          installed torch), under Python tests (the pytest arguments, with
#          LeakSanitizer unless BATCHCAST_PY_LEAKS=0; by default
#          test_transform.py with it, and producers and consumers in real
#          processes without it: exactly-once, joining, groups, transform
#          threads, forks, exits), the ASan runtime preloaded into the
#          uninstrumented python (and its children);
# address-build: only the build of `address` (CI starts it early, at low
#          priority, beside steps that leave a CPU idle);
# all (the default): address, thread, then python.
# Any report fails the run. Needs what scripts/setup.sh installs (cmake,
# ninja, g++ with libasan/libubsan/libtsan, libgtest-dev, libzmq3-dev, torch,
# scikit-build-core, pytest). BATCHCAST_SANITIZE_JOBS: build jobs (2).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PY=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')  # not a pyenv shim
JOBS=${BATCHCAST_SANITIZE_JOBS:-2}
supp=$root/tests/sanitizers
stage=$root/build/asan-stage  # python: the package with the ASan _C
libasan=""                  # python: what LD_PRELOAD loads

stage_times=()
timed() {  # timed NAME COMMAND...: runs it, keeps its time for the summary
  local name=$1 started=$SECONDS
  shift
  echo "== $name"
  "$@"
  stage_times+=("$(printf '%5d s  %s' $((SECONDS - started)) "$name")")
}
summary() {
  local status=$?
  [ ${#stage_times[@]} -eq 0 ] || printf '   %s\n' "${stage_times[@]}"
  if [ "$status" -eq 0 ]; then echo "== sanitizers: no report ($SECONDS s)"
  else echo "== sanitizers: FAILED (exit status $status)"; fi
}
trap summary EXIT

# Every report fails the test: ASan stops at the first error, UBSan's checks
# are built unrecoverable (-fno-sanitize-recover=undefined), LSan (part of
# ASan) fails the process at exit, TSan stops at the first report and exits 66.
# Options already in the environment come last, so they win (say,
# ASAN_OPTIONS=handle_segv=0 for test_processes.py's test of a write into a
# batch, which expects death by SIGSEGV, not ASan's report of it and exit 1).
user_asan=${ASAN_OPTIONS:-}
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1:strict_string_checks=1${user_asan:+:$user_asan}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export TSAN_OPTIONS="halt_on_error=1:exitcode=66:second_deadlock_stack=1:suppressions=$supp/tsan.supp${TSAN_OPTIONS:+:$TSAN_OPTIONS}"

configure_and_build() {  # configure_and_build KIND DIR
  local log=$2/sanitizers-configure.log python=OFF
  [ "$1" = address ] && python=ON  # the python stage's _C, from the same objects
  mkdir -p "$2"
  cmake -S . -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython_EXECUTABLE="$PY" \
    -DBATCHCAST_SANITIZE="$1" -DBATCHCAST_BUILD_TESTS=ON -DBATCHCAST_BUILD_PYTHON=$python \
    -DBATCHCAST_BUILD_EXAMPLES=OFF >"$log" || { cat "$log"; return 1; }
  grep 'batchcast: sanitizers' "$log"
  nice -n 5 cmake --build "$2" -j "$JOBS"
  # The runtime is really in the tests (an option lost on the way would pass silently).
  local runtime=asan
  [ "$1" = thread ] && runtime=tsan
  for test in "$2"/test_*; do
    [[ $(ldd "$test") == *"lib$runtime.so"* ]] || { echo "$test: no lib$runtime"; return 1; }
  done
}

run_ctest() {  # run_ctest DIR
  # One test at a time: the sanitizers slow each several times over, and the
  # tests' own deadlines are for a machine that is not busy with others.
  ctest --test-dir "$1" --output-on-failure --timeout 900
}

cpp() {  # cpp KIND DIR
  timed "$1: configure and build ($2)" configure_and_build "$1" "$2"
  timed "$1: ctest ($2)" run_ctest "$2"
}

python_asan() {
  # (after `address`, nothing to build)
  timed "python: _C and the tests (build/asan)" configure_and_build address build/asan
  # The package as it is here, with the ASan build's compiled modules.
  rm -rf "$stage"
  mkdir -p "$stage"
  cp -r python/batchcast "$stage/"
  rm -rf "$stage"/batchcast/__pycache__
  cp build/asan/_C*.so build/asan/_status*.so "$stage/batchcast/"
  # python is not instrumented: the ASan runtime must come first, preloaded
  # (and so into every python the tests start, which inherit LD_PRELOAD), and
  # libstdc++ with it: python does not link it, and ASan resolves the
  # __cxa_throw it wraps when it starts, so without it the first C++
  # exception is "CHECK failed: ... real___cxa_throw != 0"
  # (github.com/google/sanitizers/issues/934).
  # torch is imported first, as batchcast does: _C finds libtorch_cpu among
  # the loaded libraries.
  local where
  libasan="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)"
  export PYTHONPATH="$stage${PYTHONPATH:+:$PYTHONPATH}"
  where=$(cd / && LD_PRELOAD="$libasan" ASAN_OPTIONS=detect_leaks=0 \
    "$PY" -c 'import torch, batchcast._C as c; print(c.__file__)')
  case "$where" in
    "$stage"/*) ;;
    *) echo "batchcast._C is $where, not the ASan build's"; return 1 ;;
  esac
  [[ $(ldd "$where") == *libasan.so* ]] || { echo "$where: no libasan"; return 1; }
  if [ ${#PYTEST_ARGS[@]} -gt 0 ]; then
    python_tests "${BATCHCAST_PY_LEAKS:-1}" "${PYTEST_ARGS[@]}"
  else
    # By default: the consumer's transforms (one process) with LeakSanitizer
    # ("leaks"), and producers and consumers in real processes without it
    # ("processes": under it each python takes 30-40 s to import torch here,
    # past the tests' deadlines). BATCHCAST_ASAN_PYTHON names which (both).
    local parts=" ${BATCHCAST_ASAN_PYTHON:-leaks processes} "
    if [[ $parts == *" leaks "* ]]; then
      python_tests 1 tests/python/test_transform.py
    fi
    if [[ $parts == *" processes "* ]]; then
      python_tests 0 \
        tests/python/test_processes.py::test_four_consumers_get_every_sample_once_in_order_over_two_epochs \
        tests/python/test_processes.py::test_loader_exception_reaches_consumers_with_its_message \
        tests/python/test_joining.py tests/python/test_groups.py tests/python/test_forks.py \
        "tests/python/test_endings.py::test_a_trial_process_ends"
    fi
  fi
}

python_tests() {  # python_tests LEAKS PYTEST_ARGUMENTS...: pytest on the staged package, ASan preloaded
  local leaks=$1 env_leaks=(PYTHONMALLOC=pymalloc) leak_options=detect_leaks=0
  shift
  # LeakSanitizer (LEAKS=1), with tests/sanitizers/lsan-python.supp for
  # CPython's and numpy's own allocations, about ten times slower:
  # PYTHONMALLOC=malloc puts Python objects in malloc's blocks, which LSan
  # scans (in pymalloc's arenas, whatever they alone point to would show as
  # leaked: thousands of reports, pybind11's function records among them);
  # fast_unwind_on_malloc=0 gives whole allocation stacks through CPython
  # (built without frame pointers), to tell whose a leak is.
  if [ "$leaks" = 1 ]; then
    env_leaks=(PYTHONMALLOC=malloc)
    leak_options=detect_leaks=1:fast_unwind_on_malloc=0:malloc_context_size=12
  fi
  # use_sigaltstack=0: a thread of the interpreter's (in test_forks.py's
  # trainers-in-threads process) ends with an alternate signal stack set from
  # malloc'd memory (2 * SIGSTKSZ bytes: what CPython's faulthandler
  # allocates), which ASan's thread teardown then munmaps as if it were its
  # own: "CHECK failed: ... unable to unmap", every run; no frame of
  # batchcast's in it (batchcast never calls sigaltstack).
  timed "python: pytest $* ($leak_options)" env LD_PRELOAD="$libasan" "${env_leaks[@]}" \
    ASAN_OPTIONS="$ASAN_OPTIONS:use_sigaltstack=0:$leak_options${user_asan:+:$user_asan}" \
    LSAN_OPTIONS="suppressions=$supp/lsan-python.supp:print_suppressions=0" \
    "$PY" -m pytest -q -p no:cacheprovider "$@"
}

what=${1:-all}
shift || true
PYTEST_ARGS=("$@")
case "$what" in
  address) cpp address build/asan ;;
  address-build) timed "address: configure and build (build/asan)" configure_and_build address build/asan ;;
  thread) cpp thread build/tsan ;;
  python) python_asan ;;
  all) cpp address build/asan; cpp thread build/tsan; python_asan ;;
  *) echo "usage: $0 [address|address-build|thread|python|all] [pytest arguments, for python]"; exit 2 ;;
esac

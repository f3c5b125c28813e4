#!/usr/bin/env bash
# One batchcast wheel under several torch releases (issue 45: one wheel for
# every torch). For each release given, in turn:
#   1. a fresh venv (no system site-packages) in ${TMPDIR:-/tmp};
#   2. `pip install torch==V`, nothing else (torch's own requirements: a
#      CUDA build brings its nvidia-* packages, GBs);
#   3. the test dependencies (pytest, hypothesis, pyzmq), torch held at V;
#   4. the wheel: its requirements must resolve against that torch without
#      replacing it (pip list must then show torch V, once), else it fails;
#   5. the capability set, `pytest -m every_torch` (exactly-once delivery with
#      rebatching, joining now, in-place loader workers, consumer groups,
#      resume, the simulated GPU device, padding), from the repository root
#      against the installed wheel: python/ is never on sys.path (the suite
#      always runs against the installed package), and this is checked first.
# Then a table: torch, install seconds, tests passed/failed, test seconds.
# Exits non-zero if any release fails; the others still run.
#
#   bash scripts/torch-versions.sh dist/batchcast-*.whl 2.11.0 '2.12.*' 2.14.1 2.15.0
#
# Not part of scripts/test.sh: a CUDA torch with its nvidia-* packages is
# 2-3 GB to download and 4.7-5.4 GB installed (it runs on the CPU here), about
# a minute to install and one or two to test. One venv exists at a time, and
# each is removed when its release is done (BATCHCAST_KEEP_VENVS=1 keeps
# them; their paths are printed). pip's cache is not used for torch (it would
# keep GBs per release; BATCHCAST_PIP_CACHE=1 uses it).
# A release may be a wildcard ('2.12.*': the newest 2.12).
#
# BATCHCAST_WHEEL_NO_DEPS=1 installs the wheel with --no-deps and then its
# other requirements: only for a wheel whose own pin names another torch (a
# wheel built before the stable-ABI port pins torch==<its build's torch>), to
# see whether it happens to run; its torch requirement is then not checked.
# PYTHON: the Python the venvs are made from (its version must fit the
# wheel's tag). BATCHCAST_SIMULATED_SEEDS is passed on to the tests.
set -euo pipefail
fail() { echo "torch-versions: FAIL: $*" >&2; exit 1; }
[ $# -ge 2 ] || fail "usage: bash scripts/torch-versions.sh WHEEL TORCH_VERSION..."
wheel=$(realpath -m "$1")  # before the cd: a path relative to where it was called
shift
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
{ [ -f "$wheel" ] && [[ $wheel == *.whl ]]; } || fail "no wheel at $wheel"
# pip takes a wheel by its file name (name-version-python-abi-platform.whl).
[[ $(basename "$wheel") =~ ^[A-Za-z0-9_.]+-[A-Za-z0-9_.+]+(-[0-9][A-Za-z0-9_]*)?-[a-z0-9_.]+-[a-z0-9_.]+-[a-z0-9_.]+\.whl$ ]] ||
  fail "$(basename "$wheel") is not a wheel's file name (pip would refuse it): keep the name the build gave it"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/batchcast-torch.XXXXXX")
if [ "${BATCHCAST_KEEP_VENVS:-0}" = 1 ]; then
  trap 'echo "== venvs kept in $tmp (BATCHCAST_KEEP_VENVS=1)"' EXIT
else
  trap 'rm -rf "$tmp"' EXIT
fi

# What the wheel requires of torch, from its METADATA (for the messages).
wheel_torch=$($PY - "$wheel" <<'EOF'
import sys, zipfile
from email.parser import Parser
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    reqs = Parser().parsestr(z.read(meta).decode()).get_all("Requires-Dist") or []
print(", ".join(r for r in reqs if r.split(";")[0].strip().lower().startswith("torch")) or "nothing")
EOF
)
echo "== $(basename "$wheel") (its torch requirement: ${wheel_torch}) under torch $*"

# One release, in a subshell of its own (a fail() or a failing command ends
# that release only). Leaves "torch install_s passed failed skipped tests_s"
# in $tmp/result and what it was doing last in $tmp/why, for the table.
one_release() {
  local v=$1 venv=$2
  local log="$tmp/log"
  quiet() {
    if ! "$@" >"$log" 2>&1; then
      cat "$log" >&2
      fail "torch $v: $*"
    fi
  }
  # torch held at V for every install in this venv; this also stands in for
  # any constraint file pip's configuration names.
  echo "torch==$v" >"$tmp/pin.txt"
  export PIP_CONSTRAINT="$tmp/pin.txt"
  local cache=(--no-cache-dir)
  [ "${BATCHCAST_PIP_CACHE:-0}" != 1 ] || cache=()

  # Every torch distribution pip lists; exactly one, of release V.
  check_torch() {
    local listed
    listed=$("$V" -m pip list --format=freeze 2>/dev/null | grep -iE '^torch==' || true)
    [ "$(grep -c . <<<"$listed")" = 1 ] || fail "torch $v: pip list shows ${listed:-no torch} after $1"
    local got=${listed#*==}
    # shellcheck disable=SC2053  # $v may be a wildcard (2.12.*): a glob on purpose
    [[ ${got%%+*} == $v ]] || fail "torch $v: pip list shows torch $got after $1 (pip replaced torch)"
  }

  local t0=$SECONDS
  echo "installing torch" >"$tmp/why"
  "$PY" -m venv "$venv"
  V="$venv/bin/python"
  quiet "$V" -m pip install "${cache[@]}" "torch==$v"
  local torch_s=$((SECONDS - t0))
  check_torch "pip install torch==$v"
  local t1=$SECONDS
  echo "installing the test dependencies" >"$tmp/why"
  quiet "$V" -m pip install -c tests/constraints.txt pytest hypothesis pyzmq
  check_torch "installing pytest, hypothesis, pyzmq"
  local deps_s=$((SECONDS - t1)) t2=$SECONDS
  echo "installing the wheel" >"$tmp/why"
  if [ "${BATCHCAST_WHEEL_NO_DEPS:-0}" = 1 ]; then
    quiet "$V" -m pip install --no-deps "$wheel"
    # Its other requirements (not torch, no extras), as its METADATA lists them.
    mapfile -t others < <("$V" - "$wheel" <<'EOF'
import sys, zipfile
from email.parser import Parser
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    reqs = Parser().parsestr(z.read(meta).decode()).get_all("Requires-Dist") or []
for r in reqs:
    if ";" not in r and not r.strip().lower().startswith("torch"):
        print(r.strip())
EOF
)
    [ ${#others[@]} = 0 ] || quiet "$V" -m pip install "${others[@]}"
    echo "   wheel installed with --no-deps (BATCHCAST_WHEEL_NO_DEPS=1): its requirement ${wheel_torch} not checked"
  else
    if ! "$V" -m pip install "$wheel" >"$log" 2>&1; then
      cat "$log" >&2
      fail "torch $v: pip could not install the wheel beside torch $v (it requires ${wheel_torch}): $(grep -E '^ERROR' "$log" | tail -1)"
    fi
    quiet "$V" -m pip check
  fi
  check_torch "installing the wheel"
  local wheel_s=$((SECONDS - t2))
  local install_s=$((SECONDS - t0))
  echo "   installed in ${install_s} s (torch ${torch_s} s, test dependencies ${deps_s} s, wheel ${wheel_s} s); venv $(du -sh "$venv" | cut -f1)"
  local installed
  installed=$("$V" -m pip list --format=freeze 2>/dev/null | sed -n 's/^[Tt]orch==//p')
  echo "$installed $install_s - - - -" >"$tmp/result"
  echo "importing batchcast" >"$tmp/why"

  # The tests import the installed batchcast: from the repository root, with
  # what pytest and the worker processes put on sys.path (the root, and
  # tests/python for conftest.py and the workers), it must come from the venv.
  local site where
  site=$("$V" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')
  # (A torch without numpy warns once at import that it has none: not a failure.)
  local nonumpy="ignore:Failed to initialize NumPy:UserWarning"
  where=$(env -u PYTHONPATH "$V" -W "$nonumpy" -c '
import sys
sys.path[:0] = ["", "tests/python"]
import torch, batchcast
print(batchcast.__file__, torch.__version__, batchcast.cuda_available())')
  read -r bc_file torch_version cuda <<<"$where"
  [[ $bc_file == "$site"/batchcast/* ]] ||
    fail "torch $v: from the repository root, import batchcast finds $bc_file, not the wheel in $site"
  echo "   import batchcast: $bc_file; torch $torch_version (CUDA device visible: $cuda)"

  local t3=$SECONDS rc=0
  env -u PYTHONPATH HYPOTHESIS_STORAGE_DIRECTORY="$tmp/hypothesis" \
    "$V" -m pytest -q -p no:cacheprovider -W "$nonumpy" -m every_torch --junitxml="$tmp/junit.xml" \
    tests/python || rc=$?
  local tests_s=$((SECONDS - t3))
  local counts
  counts=$("$V" - "$tmp/junit.xml" <<'EOF'
import sys
import xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):  # pytest died before writing it
    print("- - -")
    sys.exit()
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
print(n["tests"] - n["failures"] - n["errors"] - n["skipped"], n["failures"] + n["errors"], n["skipped"])
EOF
)
  read -r passed failed skipped <<<"$counts"
  echo "$installed $install_s $passed $failed $skipped $tests_s" >"$tmp/result"
  if [ "$rc" -gt 128 ]; then
    echo "pytest crashed (signal $((rc - 128)))" >"$tmp/why"
    fail "torch $v: pytest -m every_torch crashed (signal $((rc - 128))); the traceback above names the test"
  fi
  echo "pytest exited $rc" >"$tmp/why"
  [ "$rc" = 0 ] || fail "torch $v: pytest -m every_torch exited $rc ($passed passed, $failed failed)"
  { [ "$passed" != - ] && [ "$passed" -gt 0 ]; } || fail "torch $v: no test passed"
}

rows=()
status=0
for v in "$@"; do
  echo "== torch $v"
  need_kb=$((8 * 1024 * 1024))
  free_kb=$(df -Pk "$tmp" | awk 'NR == 2 { print $4 }')
  [ "$free_kb" -ge "$need_kb" ] ||
    fail "$((free_kb / 1024 / 1024)) GB free in $tmp; a torch venv takes up to 8 GB"
  venv="$tmp/venv-${v//\*/x}"
  rm -f "$tmp/result" "$tmp/why" "$tmp/junit.xml"
  started=$SECONDS
  # Not `if (one_release ...)`: set -e is off for everything run as a
  # condition, so the subshell runs as a statement of its own.
  set +e
  (set -e; one_release "$v" "$venv")
  rc=$?
  set -e
  if [ "$rc" = 0 ]; then
    result=passed
  else
    result="FAILED: $(cat "$tmp/why" 2>/dev/null || echo "exit $rc")"
    status=1
  fi
  total=$((SECONDS - started))
  if [ -f "$tmp/result" ]; then
    read -r installed install_s passed failed skipped tests_s <"$tmp/result"
  else
    installed=$v install_s="-" passed="-" failed="-" skipped="-" tests_s="-"
  fi
  rows+=("$(printf '%-10s %10s %7s %7s %8s %8s %8s  %s' "$installed" "$install_s" "$passed" "$failed" \
    "$skipped" "$tests_s" "$total" "$result")")
  if [ "${BATCHCAST_KEEP_VENVS:-0}" = 1 ]; then
    echo "   venv kept: $venv"
  else
    removing=$SECONDS
    rm -rf "$venv"
    echo "   venv removed ($((SECONDS - removing)) s)"
  fi
done

echo "== $(basename "$wheel") under each torch (seconds)"
printf '%-10s %10s %7s %7s %8s %8s %8s  %s\n' torch "install s" passed failed skipped "tests s" "total s" result
printf '%s\n' "${rows[@]}"
[ "$status" = 0 ] || fail "not every torch release passed (above)"
echo "== every release passed"

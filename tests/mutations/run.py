"""Proves that the tests can fail: builds batchcast with one deliberate bug at
a time (a mutant) and runs the tests meant to catch it against it — for the
GPU ring the simulated-device tests (tests/python/test_gpu_rules.py), for the
slot ledger the tests with real consumer processes, for the join plan its
model test (tests/cpp/test_join_plan.cpp), for re-padding the property test
of samples of variable length. Every mutant must be caught: some
test must fail. Prints which tests caught which mutant.

    python tests/mutations/run.py                   # every mutant, against the tests meant to catch it
    python tests/mutations/run.py --all-tests       # ... against every simulated-device test
    python tests/mutations/run.py --only ready-without-wait --seeds 1,2
    python tests/mutations/run.py --on gpu          # on a GPU machine: the same tests on the GPU
    python tests/mutations/run.py --share 2/4       # the second quarter of them (CI: a rotating share)

--share K/N takes every N-th mutant from the K-th on (1-based), in the order
listed here: N runs with K = 1..N cover every mutant once. CI runs one share
each time, K chosen from the commit count (scripts/long-checks.sh), so a
mutant whose test stops catching it fails CI within N landings; the whole set
is run before resolving an issue that touches a mutated file or its tests.

The source is copied to build/mutants/src and built once there (CMake + Ninja,
no C++ tests); each mutant changes one file, is rebuilt incrementally, staged
with the Python package on PYTHONPATH, tested, and reverted. Exit status: 0
when every mutant was caught, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# name: (file, [(original text, mutated text), ...], what the bug is, the tests
# meant to catch it: a pytest -k expression within test_gpu_rules.py, or within
# the test file given as a fifth element; or a GoogleTest filter for the C++
# test program given as a fifth element "cpp:NAME")
MUTANTS = {
    "ready-without-wait": (
        "csrc/batchcast/consumer/mapped_ring.cpp",
        [("    cuda::runtime().stream_wait(stream, memory_->event(event));\n", "")],
        "the consumer's stream does not wait on the slot's event before reading it",
        "read_after_its_copy",
    ),
    "event-before-copy": (
        "csrc/batchcast/ring/cuda_ring.cpp",
        [("    sources_[buffer].clear();\n", "    sources_[buffer].clear();\n    memory_->record_slot(slot.event);\n"),
         ("    memory_->record_slot(slot.event);\n    memory_->finish_staging();\n",
          "    memory_->finish_staging();\n")],
        "the producer records the slot's event before the batch's copies instead of after",
        "read_after_its_copy",
    ),
    "wrong-event": (
        "csrc/batchcast/ring/cuda_ring.cpp",
        [("    memory_->record_slot(slot.event);\n",
          "    memory_->record_slot((slot.event + 1) % static_cast<int>(description_.event_handles.size()));\n")],
        "the producer records another slot's event than the one it announces",
        "read_after_its_copy",
    ),
    "staging-reused-without-wait": (
        "csrc/batchcast/cuda/transport.cpp",
        [("  rt.event_synchronize(s.done);\n", "")],
        "a staging buffer is refilled before the copies out of it are done",
        "read_after_its_copy and pageable",
    ),
    "pinned-source-dropped": (
        "csrc/batchcast/ring/cuda_ring.cpp",
        [("        sources_[buffer].push_back(*t);  // alive until the copy is done\n", "")],
        "a pinned loader tensor is let go before the copy straight out of it is done",
        "read_after_its_copy and pinned",
    ),
    "mirror-not-pinned": (
        "csrc/batchcast/ring/cuda_ring.cpp",
        [("      cuda::runtime().host_register(region.data(), region.size());\n", ""),
         ("    if (mirror_ && p >= mirror_->region.data()", "    if (false && p >= mirror_->region.data()")],
        "the loader workers' host mirror is not pinned: their batches take the copy through staging",
        "pinned_mirror",
    ),
    "release-ignores-stream": (
        "csrc/batchcast/consumer/mapped_ring.cpp",
        [("    void* event = nullptr;\n    try {\n      cuda::DeviceScope scope(stream->device);\n",
          "    released_(seq);\n    return;\n    void* event = nullptr;\n    try {\n"
          "      cuda::DeviceScope scope(stream->device);\n")],
        "a slot goes back as soon as its tensors are freed, before the consumer's stream is past them",
        "reused_only_after",
    ),
    "gpu-views-not-copied": (
        "csrc/batchcast/consumer/consumer.cpp",
        [("    copy_out_ = options_.writable || (transfer_ == Transfer::View && !options_.shared_gpu_views);\n",
          "    copy_out_ = options_.writable;\n")],
        "GPU batches are handed out as views of the shared ring, so one trainer's in-place op changes another's",
        "in_place_write",
    ),
    "private-copy-off-stream": (
        "csrc/batchcast/consumer/transfer.cpp",
        [("    rt->launch_host_function(stream, [memory, from, bytes] { std::memcpy(memory, from, bytes); });\n",
          "    std::memcpy(memory, from, bytes);\n")],
        "a GPU batch's private copy is made at once rather than in stream order, before the slot is readable",
        "reused_only_after and copy",
    ),
    "release-after-device-ignored": (
        "csrc/batchcast/consumer/mapped_ring.cpp",
        [("    if (after_ == ReleaseAfter::Device) {\n", "    if (false) {\n")],
        "release_after='device' waits only for the streams the batch was taken and freed on",
        "side_stream",
    ),
    "ledger-frees-on-first-release": (
        "csrc/batchcast/producer/slot_ledger.cpp",
        [("  free_if_unheld(it);\n  return true;\n", "  it->second.holders.clear();\n  free_if_unheld(it);\n  return true;\n")],
        "the slot ledger frees a slot when its first holder releases it, while other consumers still hold it",
        "keeping_every_batch",
        "test_processes.py",
    ),
    "repad-ignores-the-declared-value": (
        "csrc/batchcast/consumer/rebatcher.cpp",
        [("        Tensor padded = full(shape, *pad_of[j], dtype, device);\n",
          "        Tensor padded = full(shape, 0.0, dtype, device);\n")],
        "re-padded positions get 0 instead of the value declared for the leaf (labels -100 read as a class)",
        "every_sample_arrives_once",
        "test_padding.py",
    ),
    "identity-ignores-where-a-piece-starts": (
        "csrc/batchcast/consumer/rebatcher.cpp",
        [("        for (int64_t i = 0; i < p.count; ++i) out.indices.push_back(p.batch->first_position + p.start + i);\n",
          "        for (int64_t i = 0; i < p.count; ++i) out.indices.push_back(p.batch->first_position + i);\n"),
         ("        out.indices.insert(out.indices.end(), a.indices.begin() + p.start, a.indices.begin() + p.start + p.count);\n",
          "        out.indices.insert(out.indices.end(), a.indices.begin(), a.indices.begin() + p.count);\n")],
        "a consumer batch that starts inside a loader batch names the identities of that loader batch's "
        "first samples: a trainer's augmentation then depends on its batch size, and with_indices lies",
        "one_seed_one_augmentation or with_indices",
        "test_transform.py",
    ),
    "forked-child-releases-parents-slots": (
        "csrc/batchcast/consumer/rebatcher.h",
        [("    if (born_.here()) {\n      sink_->release(seq_, stream_);", "    if (true) {\n      sink_->release(seq_, stream_);")],
        "a trainer's forked child that drops its copy of a batch gives the parent's ring slot back: the "
        "producer overwrites a batch the parent still holds",
        "fork",
        "test_forks.py",
    ),
    "fork-ignores-a-trainers-turn": (
        "python/batchcast/consumer.py",
        [("            raise\n        self._turn.resume()\n", "            raise\n"),
         ("    def _resume_turn(self) -> None:\n        self._turn.resume()\n",
          "    def _resume_turn(self) -> None:\n        pass\n")],
        "a fork of a trainer's process does not wait for the thread that iterates a consumer: a loader "
        "worker forked while the trainer builds its model or steps copies a torch lock held and hangs",
        "no_trainer_thread or first_workers",
        "test_forks.py",
    ),
    "fork-guard-counts-consumers-not-threads": (
        "python/batchcast/_forks.py",
        [("        own_code = bool(self.turns) and self.waiting == 0\n",
          "        own_code = len(self.turns) > self.waiting\n")],
        "the fork guard counts a thread's idle consumers as its own code while it waits inside another "
        "(a notebook's train and validation pair): every fork of the producer's loader waits FORK_WAIT",
        "notebook_with and zip",
        "test_forks.py",
    ),
    "cache-trusts-a-damaged-file": (
        "python/batchcast/_cache.py",
        [("            if damaged:\n                self._repair(", "            if False:\n                self._repair(")],
        "a disk cache file whose blocks do not match their checksums is served as it is: flipped bytes "
        "reach the trainers as samples",
        "damaged_disk_cache",
        "test_cache.py",
    ),
    "cache-gathers-the-wrong-row": (
        "python/batchcast/_cache.py",
        [("                    torch.index_select(kept.rows, 0, at, out=out)\n",
          "                    torch.index_select(kept.rows, 0, (at + 1) % self.size, out=out)\n")],
        "a batch made from the decoded cache gathers the row after each sample's: every later epoch "
        "hands out other samples' values under the right identities",
        "later_epochs or joins_and_resumes",
        "test_cache.py",
    ),
    "join-plan-lets-drop-last-in": (
        "csrc/batchcast/producer/join_plan.cpp",
        [("    cuts.push_back(options_.samples_per_epoch);  // what drop_last leaves out stays out\n", "")],
        "the producer's order lets samples a drop_last epoch leaves out into the blocks it keeps, so a "
        "consumer that joined mid-epoch gets some samples twice and misses others",
        "JoinPlan.*",
        "cpp:test_join_plan",
    ),
    "strided-copy-runs-across-strides": (
        "csrc/batchcast/tensor/tensor.cpp",
        [("while (inner >= 0 && (shape[inner] == 1 || strides[inner] == run)) run *= shape[inner--];",
          "while (inner >= 0 && (shape[inner] == 1 || strides[inner] == run || inner > 0)) run *= shape[inner--];")],
        "the serial copy of a strided tensor into the ring copies its outer dimensions as one block, "
        "so a permuted or sliced batch arrives with other values than the loader's",
        "Tensor.*",
        "cpp:test_tensor",
    ),
    "view-holds-only-its-first-slot": (
        "csrc/batchcast/consumer/rebatcher.cpp",
        [("        if (pieces.size() > 1) {\n", "        if (false) {\n")],
        "a batch that is one view over several ring slots holds only the first: the others go back "
        "while the trainer still reads them, and the producer overwrites its samples",
        "Rebatcher.*",
        "cpp:test_rebatcher",
    ),
    "close-interrupted-leaves-its-io-thread": (
        "csrc/batchcast/producer/producer.cpp",
        [("    ~LetGo() { p->let_go(); }", "    ~LetGo() { (void)p; }"),
         ("  if (interrupted) std::rethrow_exception(interrupted);  // (LetGo lets go first)\n",
          "  if (interrupted) std::rethrow_exception(interrupted);\n  let_go();\n")],
        "a close() ended by Ctrl-C leaves the I/O thread joinable: the producer's destructor (at the "
        "interpreter's exit) is std::terminate",
        "EndToEnd.ACloseInterrupted*",
        "cpp:test_end_to_end",
    ),
    "join-plan-resumes-past-an-epoch-begun-without-its-block": (
        "csrc/batchcast/producer/join_plan.cpp",
        [("  for (int64_t x = e + 1; x <= steered_epoch_ && order_kept; ++x) {\n",
          "  for (int64_t x = r.at_epoch; x == e + 1 && x <= steered_epoch_ && order_kept; ++x) {\n")],
        "a consumer that joined mid-epoch resumes exactly after the producer began an epoch ordered "
        "without its join position: its next epoch gets some samples twice and misses others",
        "JoinPlan.*",
        "cpp:test_join_plan",
    ),
    "join-plan-trusts-another-runs-position": (
        "csrc/batchcast/producer/join_plan.cpp",
        [("  if (request.resume_epoch >= 0 && !request.saved_in_this_run) {\n",
          "  if (request.resume_epoch >= 0 && !request.saved_in_this_run && false) {\n")],
        "a state saved mid-epoch against a producer since restarted resumes as if exact: the new run's "
        "order is another pass, so some samples of that epoch come twice and others never (no warning)",
        "JoinPlan.*",
        "cpp:test_join_plan",
    ),
    "join-plan-keeps-who-left": (
        "csrc/batchcast/producer/join_plan.cpp",
        [("void JoinPlan::left(uint64_t member) { joined_at_.erase(member); }",
          "void JoinPlan::left(uint64_t member) { (void)member; }")],
        "the join plan keeps ordering epochs by the join position of a consumer that left",
        "JoinPlan.*",
        "cpp:test_join_plan",
    ),
}


def cpp_test(name: str) -> str | None:
    """The C++ test program a mutant is meant to be caught by, if any."""
    tests = MUTANTS[name][4] if len(MUTANTS[name]) > 4 else None
    return tests[len("cpp:"):] if tests and tests.startswith("cpp:") else None


def targets_filter(name: str) -> str:
    return MUTANTS[name][3]


def run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, text=True, **kw)


def copy_source(src: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    for rel in files.decode().split("\0"):
        if not rel or not (ROOT / rel).is_file():
            continue
        target = src / rel
        if target.exists() and target.read_bytes() == (ROOT / rel).read_bytes():
            continue  # unchanged: keep its time stamp, so Ninja rebuilds nothing
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)


def python_tests(name: str, targets: str, tests: str | None, src: Path, stage: Path, build: Path, work: Path,
                 args: argparse.Namespace) -> tuple[bool, list[str]]:
    """Runs a mutant's Python tests against its build and its copy of the
    package (a mutant may change either): (caught, the tests that failed)."""
    if stage.exists():
        shutil.rmtree(stage)
    shutil.copytree(src / "python" / "batchcast", stage / "batchcast",
                    ignore=shutil.ignore_patterns("_C*.so", "__pycache__"))
    for so in [*build.glob("_C*.so"), *build.glob("_status*.so")]:  # every compiled module of the package
        shutil.copy2(so, stage / "batchcast")
    report = work / f"{name}.xml"
    where = "simulated" if args.on == "simulated" else "hardware"  # the runs' ids
    env = {**os.environ, "PYTHONPATH": f"{stage}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "BATCHCAST_SIMULATED_SEEDS": args.seeds}
    if tests is None:  # the GPU ring's rules, on the device asked for
        select, file = where if args.all_tests else f"{where} and ({targets})", "test_gpu_rules.py"
    else:
        select, file = "" if args.all_tests else targets, tests
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", select,
         f"--junitxml={report}", str(ROOT / "tests" / "python" / file)],
        env=env, text=True, capture_output=True, cwd=str(ROOT))
    failed = []
    if report.exists():
        for case in ET.parse(report).getroot().iter("testcase"):
            for child in case:
                # A test module that cannot even be imported proves nothing
                # about the mutant: the harness is broken, which is an error.
                if child.tag == "error" and (child.get("message") or "").startswith("collection failure"):
                    raise SystemExit(f"mutant {name}: {file} could not be collected, so nothing was tested:\n"
                                     f"{child.text}")
            if any(child.tag in ("failure", "error") for child in case):
                failed.append(case.get("name"))
    return proc.returncode != 0 and bool(failed), failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", choices=sorted(MUTANTS), help="these mutants only")
    ap.add_argument("--seeds", default="1", help="simulated-device seeds for the tests (BATCHCAST_SIMULATED_SEEDS)")
    ap.add_argument("--all-tests", action="store_true",
                    help="run every simulated-device test on each mutant (default: the tests meant to catch it)")
    ap.add_argument("--on", choices=["simulated", "gpu"], default="simulated",
                    help="run the tests on the simulated device, or on a real GPU")
    ap.add_argument("--cmake-arg", action="append", default=[],
                    help="an extra CMake argument for the mutants' build (repeatable)")
    ap.add_argument("--share", metavar="K/N",
                    help="the K-th of N shares of the mutants (every N-th from the K-th on)")
    ap.add_argument("--work", default=str(ROOT / "build" / "mutants"))
    ap.add_argument("--jobs", default=str(os.cpu_count() or 2))
    args = ap.parse_args()
    work = Path(args.work)
    # The build folder sits in the copy where build/py sits in the tree, and
    # with the compiler and flags scripts/setup.sh gives: with ccache
    # (base_dir the tree), the unmutated copy's objects are those of the
    # set-up's build, found in the cache instead of compiled again.
    src, stage = work / "src", work / "stage"
    build = src / "build" / "py"
    names = args.only or [n for n in MUTANTS if args.on == "simulated" or not cpp_test(n)]
    if args.share:
        found = re.fullmatch(r"(\d+)/(\d+)", args.share)
        if not found or not 1 <= int(found[1]) <= int(found[2]):
            ap.error(f"--share {args.share}: give K/N with 1 <= K <= N, e.g. 2/4")
        k, n = int(found[1]), int(found[2])
        names = names[k - 1::n]
        print(f"share {k}/{n}: {len(names)} mutants: {', '.join(names)}")
    programs = sorted({p for p in map(cpp_test, names) if p})  # C++ test programs to build

    started = time.monotonic()
    copy_source(src)
    for name in names:  # the pristine text must be there, exactly once
        rel, edits = MUTANTS[name][:2]
        for old, _ in edits:
            count = (src / rel).read_text().count(old)
            if count != 1:
                print(f"mutant {name}: its original text occurs {count} times in {rel}; update {__file__}")
                return 1
    launcher = [f"-DCMAKE_CXX_COMPILER_LAUNCHER={shutil.which('ccache')}"] if shutil.which("ccache") else []
    # ...and the compiler by the name the set-up's build gave it (ccache tells
    # /usr/bin/c++ from /usr/bin/g++, the same file).
    setup_cache = ROOT / "build" / "py" / "CMakeCache.txt"
    if launcher and setup_cache.is_file():
        found = re.search(r"^CMAKE_CXX_COMPILER:FILEPATH=(.+)$", setup_cache.read_text(), re.M)
        if found:
            launcher.append(f"-DCMAKE_CXX_COMPILER={found[1].strip()}")
    os.environ.setdefault("CCACHE_BASEDIR", str(ROOT))
    # The set-up builds with -Werror; a mutant may well warn (a variable it
    # no longer uses) and must still build: -Werror is left out of ccache's
    # hash on both sides (scripts/setup.sh), as it changes no object.
    os.environ.setdefault("CCACHE_IGNOREOPTIONS", "-Werror")
    run(["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
         f"-DPython_EXECUTABLE={sys.executable}", f"-DBATCHCAST_BUILD_TESTS={'ON' if programs else 'OFF'}",
         "-DBATCHCAST_BUILD_EXAMPLES=OFF", *launcher, *args.cmake_arg],
        stdout=subprocess.DEVNULL)
    # The Python package, and the C++ test programs asked for.
    build_targets = ["--target", "_C", "_status", *programs]
    run(["cmake", "--build", str(build), "-j", args.jobs, *build_targets], stdout=subprocess.DEVNULL)
    print(f"built the unmutated copy in {time.monotonic() - started:.0f} s")

    results = []
    for name in names:
        rel, edits, what, targets = MUTANTS[name][:4]
        tests = MUTANTS[name][4] if len(MUTANTS[name]) > 4 else None
        path = src / rel
        pristine = path.read_text()
        t0 = time.monotonic()
        try:
            mutated = pristine
            for old, new in edits:
                mutated = mutated.replace(old, new)
            path.write_text(mutated)
            run(["cmake", "--build", str(build), "-j", args.jobs, *build_targets], stdout=subprocess.DEVNULL)
            program = cpp_test(name)
            if program is not None:  # a C++ test program: caught when it fails
                proc = subprocess.run([str(build / program), f"--gtest_filter={targets}"],
                                      text=True, capture_output=True)
                failed = sorted(set(re.findall(r"^\[  FAILED  \] (\w+\.\w+)", proc.stdout, re.M)))
                caught = proc.returncode != 0
            else:
                caught, failed = python_tests(name, targets, tests, src, stage, build, work, args)
            results.append((name, what, caught, failed, time.monotonic() - t0))
        finally:
            path.write_text(pristine)
        caught_text = "CAUGHT" if results[-1][2] else "SURVIVED"
        print(f"{caught_text:8s} {name} ({results[-1][4]:.0f} s): {what}", flush=True)
        for test in results[-1][3]:
            print(f"           failed: {test}")
    run(["cmake", "--build", str(build), "-j", args.jobs, *build_targets], stdout=subprocess.DEVNULL)  # back to pristine
    survived = [r[0] for r in results if not r[2]]
    print(f"{len(results) - len(survived)} of {len(results)} mutants caught"
          + (f"; SURVIVED: {', '.join(survived)}" if survived else "")
          + f" ({time.monotonic() - started:.0f} s)")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())

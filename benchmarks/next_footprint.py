"""Instructions and simulated cache misses of a trainer's `next()` per batch: a
figure that does not move with the machine's noise, for changes too small for
timings to resolve (a cold `next()` varies by tens of µs from run to run).

    python benchmarks/next_footprint.py BUILD [BUILD ...] [--tensors 4] [--cold]

Needs valgrind (apt install valgrind); a BUILD is a folder holding a
`batchcast` package, put first on PYTHONPATH (a RelWithDebInfo build names
its functions). One process runs a producer (in-process) and a consumer
without batch_size over N loader batches of `tensors` 8x16 float32 tensors,
under callgrind, for N = 60 and 160; a figure per batch is (value at 160 -
value at 60) / 100, so start-up and shutdown cancel out. With --cold, each
batch is followed by a write over 32 MB (a training step's memory traffic)
and callgrind simulates the caches (32 KB L1s, a 1 MB last level): the
last-level misses per batch then count the code and data a cold `next()`
brings in from memory.

Rows: the binding's next() (everything the trainer's call does in C++,
handing the tensors to torch included), the core's part of it
(Consumer::next_views or next), and the tensors' release when Python frees
them (torch's deallocation down to the ring slot going back).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

LOOP = r"""
import os, sys, torch, batchcast as bc
torch.set_num_threads(1)
batches, tensors, cold = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
data = [tuple(torch.full((8, 16), i, dtype=torch.float32) for _ in range(tensors)) for i in range(batches)]
buf = torch.zeros(8 << 20) if cold else None
name = f"footprint-{os.getpid()}"
with bc.Producer(data, name, epochs=1, slots=8):
    c = bc.Consumer(name)
    n = 0
    for b in c:
        n += 1
        del b
        if cold:
            buf.add_(1)
    c.close()
assert n == batches, n
"""

ROWS = [
    ("binding next()", r"initialize<pybind11_init__C\(pybind11::module_&\)::\{lambda\(\(anonymous namespace\)::"
                       r"Bound<batchcast::Consumer>&(, bool)?\)#\d+\}, pybind11::object"),
    ("core next", r"batchcast::Consumer::next_views\((bool)?\)|batchcast::Consumer::next\(\)"),
    ("release (THPVariable_dealloc)", r"THPVariable_dealloc\(_object\*\)"),
]


def profile(build: str, batches: int, tensors: int, cold: bool, folder: str) -> dict[str, list[int]]:
    script = os.path.join(folder, "loop.py")
    with open(script, "w") as f:
        f.write(LOOP)
    out = os.path.join(folder, f"cg-{batches}.out")
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    if cold:
        cmd += ["--cache-sim=yes", "--I1=32768,8,64", "--D1=32768,8,64", "--LL=1048576,16,64"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (build, os.environ.get("PYTHONPATH")) if p))
    subprocess.run(cmd + [os.path.realpath(sys.executable), script, str(batches), str(tensors), "1" if cold else "0"],
                   env=env, check=True, capture_output=True, cwd=folder)
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", out], check=True,
                          capture_output=True, text=True).stdout
    events: list[str] = []
    found: dict[str, list[int]] = {}
    number = r"\s*([\d,]+)(?: \([^)]*\))?"
    for line in text.splitlines():
        if line.startswith("Events shown:"):
            events = line.split(":", 1)[1].split()
            continue
        if not events or "'2" in line:
            continue
        m = re.match(number * len(events) + r"\s+(.*)$", line)
        if not m:
            continue
        name = m.group(len(events) + 1)
        for label, pattern in ROWS:
            if label not in found and re.search(pattern, name):
                found[label] = [int(x.replace(",", "")) for x in m.groups()[: len(events)]]
    found["events"] = events  # type: ignore[assignment]
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("builds", nargs="+", metavar="BUILD")
    ap.add_argument("--tensors", type=int, default=4)
    ap.add_argument("--cold", action="store_true")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed: apt install valgrind")
    wanted = ["Ir", "ILmr", "DLmr"] if args.cold else ["Ir"]
    print(f"per batch of {args.tensors} tensors ({'cold: caches simulated, 32 MB written between batches' if args.cold else 'warm'})")
    print("| build | part | " + " | ".join(wanted) + " |")
    print("|---|---|" + "---|" * len(wanted))
    for build in args.builds:
        with tempfile.TemporaryDirectory() as folder:
            low = profile(build, 60, args.tensors, args.cold, folder)
            high = profile(build, 160, args.tensors, args.cold, folder)
        events = high.pop("events")
        low.pop("events")
        for label, _ in ROWS:
            if label not in high or label not in low:
                print(f"| {build} | {label} | " + " | ".join("–" for _ in wanted) + " |")
                continue
            per = {e: (h - l) / 100 for e, h, l in zip(events, high[label], low[label])}  # type: ignore[arg-type]
            print(f"| {build} | {label} | " + " | ".join(f"{per[e]:,.0f}" for e in wanted) + " |", flush=True)


if __name__ == "__main__":
    main()

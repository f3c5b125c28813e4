"""What a thread pays for the first work after it slept: the floor under a
trainer's per-batch cost on this machine.

    python benchmarks/wakeup.py [--reps 300] [--out benchmarks/results/wakeup.md]

A trainer calls next() once per step, right after its step's GPU work (or,
in benchmarks/compare.py's overhead experiment, a 20 ms sleep). Whatever
next() does then runs on a thread that was just woken: on some machines
(virtual CPUs especially) that work costs many times what it costs back to
back — caches and TLB cold, the vCPU rescheduled. This measures that factor
for fixed pieces of work, with no batchcast in them at all:

  python     a list, a dict and a tuple of small ints (pure interpreter)
  torch      x[1:33].view(...), torch.empty(8), a list and a dict: about what
             a consumer's next() builds for a two-tensor batch
  syscall    os.getppid() (one system call)

each timed with time.thread_time_ns() (CPU of this thread only) right after:
nothing (back to back), time.sleep(d) for d in 0.1, 1, 5, 20 ms, and a 20 ms
busy-wait (the thread stays on its CPU: what is left is cache coldness, not
the wake-up). Medians with [p10, p90] over --reps.

If `torch` after a 20 ms sleep costs N times its back-to-back cost, a next()
that costs c back to back costs about N*c in a trainer loop, however little
batchcast does in it.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch

X = torch.arange(1000, dtype=torch.uint8)


def python_work() -> object:
    a = [1, 2, 3, 4]
    return {"a": a, "b": (5, 6)}, a[1:3]


def torch_work() -> object:
    a = X[1:33].view(torch.uint8)
    b = torch.empty(8)
    return [a, b], {"images": a}


def syscall_work() -> object:
    return os.getppid()


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def measure(work, before, reps: int) -> tuple[float, float, float]:
    out = []
    for _ in range(reps):
        before()
        t0 = time.thread_time_ns()
        work()
        out.append((time.thread_time_ns() - t0) / 1e3)
    deciles = statistics.quantiles(out, n=10)
    return statistics.median(out), deciles[0], deciles[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    works = {"python": python_work, "torch": torch_work, "syscall": syscall_work}
    befores = {"back to back": lambda: None}
    for ms in (0.1, 1, 5, 20):
        befores[f"sleep {ms:g} ms"] = (lambda s: lambda: time.sleep(s))(ms / 1000)
    befores["busy-wait 20 ms"] = lambda: spin(0.02)
    for work in works.values():  # warm up
        measure(work, lambda: None, 50)
    rows = []
    base = {}
    for label, before in befores.items():
        cells = []
        for name, work in works.items():
            med, p10, p90 = measure(work, before, args.reps)
            base.setdefault(name, med)
            cells.append(f"{med:.1f} [{p10:.1f}, {p90:.1f}] ({med / base[name]:.0f}x)")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    lines = [
        f"# CPU of the first work after a thread slept ({platform.node()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}, {time.strftime('%Y-%m-%d')})",
        "",
        "`python benchmarks/wakeup.py` — microseconds of this thread's CPU, median [p10, p90] "
        f"of {args.reps}, and the median's ratio to back to back.",
        "",
        "| before the work | " + " | ".join(works) + " |",
        "|---|" + "---|" * len(works),
        *rows,
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()

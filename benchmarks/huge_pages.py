"""What 2 MiB pages for the ring save a consumer: the CPU of taking batches
on the ring's first pass (every page faulted into this process) and of
closing (every page unmapped), with the system's shared memory in 4 KiB
pages and in transparent huge pages.

    python benchmarks/huge_pages.py [--repeats 3] [--sizes 1,16,64]

The producer runs in its own process; the numbers are this (the consumer's)
process's CPU (user + system, getrusage). Switching shmem_enabled needs
root; without it, only the system's current setting is measured. The
setting is put back at the end.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import subprocess
import sys
import time

import torch

THP = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def serve(mb: int, name: str) -> None:
    import batchcast as bc

    n = mb * (1 << 20) // 4
    batches = [torch.full((1, n), float(i)) for i in range(4)]

    class Loader:
        def __len__(self) -> int:
            return 24

        def __iter__(self):
            for i in range(24):
                yield batches[i % 4]

    with bc.Producer(Loader(), name, epochs=1, slots=8) as p:
        p.run()


def measure(mb: int) -> tuple[float, float]:
    """(CPU per batch taken on the first pass, CPU of closing), in ms."""
    import batchcast as bc

    name = f"huge-pages-{os.getpid()}-{mb}"
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(mb), name])
    consumer = bc.Consumer(name, timeout=60)
    batches = iter(consumer)
    first = next(batches)  # joined, the ring mapped
    float(first[0, ::1024].sum())
    del first
    taken = []
    for _ in range(6):  # still the ring's first pass (8 slots)
        t0 = cpu()
        batch = next(batches)
        float(batch[0, ::1024].sum())  # one read per 4 KiB page
        taken.append(cpu() - t0)
        del batch
    for _ in range(8):  # the ring wraps: every page is mapped here now
        batch = next(batches)
        float(batch[0, ::1024].sum())
        del batch
    gc.collect()
    t0 = cpu()
    consumer.close()
    del batches, consumer  # the mapping goes with the last reference
    closing = cpu() - t0
    server.wait(60)
    return 1e3 * statistics.median(taken), 1e3 * closing


def current_mode() -> str:
    try:
        with open(THP) as f:
            return next(w.strip("[]") for w in f.read().split() if w.startswith("["))
    except (OSError, StopIteration):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", default="1,16,64", help="batch sizes in MiB")
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(int(args.serve[0]), args.serve[1])
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    was = current_mode()
    modes = ["never", "advise"] if os.access(THP, os.W_OK) else [was]
    rows = []
    try:
        for mode in modes:
            if mode != current_mode():
                with open(THP, "w") as f:
                    f.write(mode)
            for mb in sizes:
                runs = [measure(mb) for _ in range(args.repeats)]
                take = statistics.median(r[0] for r in runs)
                close = statistics.median(r[1] for r in runs)
                rows.append((mode, mb, take, min(r[0] for r in runs), max(r[0] for r in runs),
                             close, min(r[1] for r in runs), max(r[1] for r in runs)))
    finally:
        if current_mode() != was and os.access(THP, os.W_OK):
            with open(THP, "w") as f:
                f.write(was)
    print(f"consumer CPU, median [min, max] of {args.repeats} "
          f"({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs)\n")
    print("| shmem_enabled | batch | take a batch, first pass (ms) | close (ms) |")
    print("|---|---|---|---|")
    for mode, mb, take, tlo, thi, close, clo, chi in rows:
        print(f"| {mode} | {mb} MiB | {take:.2f} [{tlo:.2f}, {thi:.2f}] "
              f"| {close:.2f} [{clo:.2f}, {chi:.2f}] |")


if __name__ == "__main__":
    main()

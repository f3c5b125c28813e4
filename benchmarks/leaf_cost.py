"""What a trainer's `next()` costs per batch, by the number of tensors (leaves) in it.

    python benchmarks/leaf_cost.py [--leaves 1 2 8] [--steps-ms 0 20] [--batches 300] [--repeats 3]
    python benchmarks/leaf_cost.py --builds OLD/pkg NEW/pkg [--repeats 8]   # A B A B
    python benchmarks/leaf_cost.py --steps-ms 0 --touch-mb 32 ...            # cold, busy

A producer process serves `batches` identical loader batches of 64 samples
(leaf 0: 64 x 3x32x32 float32; the others: 64 int64) from memory; one consumer
with batch_size=64 (each batch a view of the ring, no copy) takes them, with
a sleep of `step` ms after each (0: back to back, caches warm; 20: a training
step's worth, caches cold again at every batch, as in a real loop). The figure
is the main thread's CPU time inside next() per batch (time.thread_time:
waiting for a batch costs none), median over the batches after the first 20
of a run; a row gives the median of the runs' medians [min, max].

--touch-mb M makes each step also write M MB of memory (a step's memory
traffic, as next_footprint.py --cold does): the caches are cold at every
next() while the CPU stays busy. A sleeping step alone lets the CPU idle,
and on a virtual machine how long it takes to wake varies by tens of µs
from run to run; with --steps-ms 0 --touch-mb 32 the cold figure does not.

--builds compares builds of batchcast (each a folder holding a `batchcast`
package, put first on PYTHONPATH): every run is a fresh process, and the
builds take turns run by run (A B A B ...), so that a drift of the machine
falls on all of them alike.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time

import torch


def serve(name: str, leaves: int, batches: int) -> None:
    import batchcast as bc

    torch.set_num_threads(1)
    batch = tuple(torch.rand(64, 3, 32, 32) if i == 0 else torch.arange(64) for i in range(leaves))
    bc.Producer([batch] * batches, name, epochs=1, slots=8).run()


def one_run(leaves: int, step_s: float, batches: int, touch_mb: float = 0.0) -> float:
    import batchcast as bc

    touched = torch.zeros(int(touch_mb * (1 << 20)) // 4) if touch_mb else None

    name = f"leaf-cost-{os.getpid()}-{leaves}-{time.monotonic_ns()}"
    producer = mp.get_context("spawn").Process(target=serve, args=(name, leaves, batches))
    producer.start()
    cpu = []
    with bc.Consumer(name, batch_size=64, timeout=120) as consumer:
        it = iter(consumer)
        for _ in range(batches):
            start = time.thread_time()
            batch = next(it)
            cpu.append(time.thread_time() - start)
            del batch
            if touched is not None:
                touched.add_(1)
            if step_s:
                time.sleep(step_s)
    producer.join()
    return statistics.median(cpu[20:])


def run_with(build: str, leaves: int, step_s: float, batches: int, touch_mb: float) -> float:
    """one_run in a fresh process with `build` first on PYTHONPATH."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (build, os.environ.get("PYTHONPATH")) if p))
    code = (f"import sys; sys.path.insert(1, {os.path.dirname(os.path.abspath(__file__))!r}); import torch; "
            f"torch.set_num_threads(1); import batchcast, leaf_cost; "
            f"assert batchcast.__file__.startswith({os.path.abspath(build)!r}), batchcast.__file__; "
            f"print(leaf_cost.one_run({leaves}, {step_s}, {batches}, {touch_mb}))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def row(runs: list[float]) -> str:
    return f"{statistics.median(runs):.1f} [{min(runs):.1f}, {max(runs):.1f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--leaves", type=int, nargs="+", default=[1, 2, 8])
    ap.add_argument("--steps-ms", type=float, nargs="+", default=[0.0, 20.0])
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--touch-mb", type=float, default=0.0,
                    help="memory each step writes (MB), evicting the caches with the CPU busy")
    ap.add_argument("--builds", nargs="+", metavar="DIR",
                    help="folders holding a batchcast package to compare, alternated run by run")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.builds:
        touch = f"; each step writes {args.touch_mb:g} MB" if args.touch_mb else ""
        print(f"torch {torch.__version__}{touch}; builds: " + ", ".join(f"{chr(65 + i)} = {b}" for i, b in enumerate(args.builds)))
        head = " | ".join(chr(65 + i) for i in range(len(args.builds)))
        print(f"| leaves | step | {head} | " + " | ".join(f"{chr(65 + i)} − A" for i in range(1, len(args.builds))) + " |")
        print("|---|---|" + "---|" * (2 * len(args.builds) - 1))
        for step in args.steps_ms:
            for leaves in args.leaves:
                runs: list[list[float]] = [[] for _ in args.builds]
                for _ in range(args.repeats):
                    for i, build in enumerate(args.builds):
                        runs[i].append(run_with(build, leaves, step / 1000, args.batches, args.touch_mb) * 1e6)
                base = statistics.median(runs[0])
                diffs = [f"{statistics.median(r) - base:+.1f} µs ({(statistics.median(r) / base - 1) * 100:+.0f}%)"
                         for r in runs[1:]]
                print(f"| {leaves} | {step:g} ms | " + " | ".join(row(r) for r in runs) + " | " + " | ".join(diffs) + " |",
                      flush=True)
        return
    import batchcast as bc

    touch = f"; each step writes {args.touch_mb:g} MB" if args.touch_mb else ""
    print(f"batchcast from {os.path.dirname(bc.__file__)}, torch {torch.__version__}{touch}")
    print("| leaves | step | next() main-thread CPU per batch, µs: median [min, max] of runs |")
    print("|---|---|---|")
    for step in args.steps_ms:
        for leaves in args.leaves:
            runs = [one_run(leaves, step / 1000, args.batches, args.touch_mb) * 1e6 for _ in range(args.repeats)]
            print(f"| {leaves} | {step:g} ms | {row(runs)} |", flush=True)


if __name__ == "__main__":
    main()

"""What a trainer's `next()` costs per batch, by the number of tensors (leaves) in it.

    python benchmarks/leaf_cost.py [--leaves 1 2 8] [--steps-ms 0 20] [--batches 300] [--repeats 3]

A producer process serves `batches` identical loader batches of 64 samples
(leaf 0: 64 x 3x32x32 float32; the others: 64 int64) from memory; one consumer
with batch_size=64 (each batch a view of the ring, no copy) takes them, with
a sleep of `step` ms after each (0: back to back, caches warm; 20: a training
step's worth, caches cold again at every batch, as in a real loop). The figure
is the main thread's CPU time inside next() per batch (time.thread_time:
waiting for a batch costs none), median over the batches after the first 20
of a run; a row gives the median of the runs' medians [min, max]. Run it with
PYTHONPATH pointing at two builds to compare them (A B A B).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

import torch


def serve(name: str, leaves: int, batches: int) -> None:
    import batchcast as bc

    torch.set_num_threads(1)
    batch = tuple(torch.rand(64, 3, 32, 32) if i == 0 else torch.arange(64) for i in range(leaves))
    bc.Producer([batch] * batches, name, epochs=1, slots=8).run()


def one_run(leaves: int, step_s: float, batches: int) -> float:
    import batchcast as bc

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
            if step_s:
                time.sleep(step_s)
    producer.join()
    return statistics.median(cpu[20:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--leaves", type=int, nargs="+", default=[1, 2, 8])
    ap.add_argument("--steps-ms", type=float, nargs="+", default=[0.0, 20.0])
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import batchcast as bc

    torch.set_num_threads(1)
    print(f"batchcast from {os.path.dirname(bc.__file__)}, torch {torch.__version__}")
    print("| leaves | step | next() main-thread CPU per batch, µs: median [min, max] of runs |")
    print("|---|---|---|")
    for step in args.steps_ms:
        for leaves in args.leaves:
            runs = [one_run(leaves, step / 1000, args.batches) * 1e6 for _ in range(args.repeats)]
            print(f"| {leaves} | {step:g} ms | {statistics.median(runs):.1f} [{min(runs):.1f}, {max(runs):.1f}] |",
                  flush=True)


if __name__ == "__main__":
    main()

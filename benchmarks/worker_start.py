"""What it would cost to make the fork hazard impossible instead of guarded:
a producer that serves from a thread of a training process could start its
DataLoader's workers with another multiprocessing context (forkserver,
spawn) or fork them once (persistent_workers) instead of forking them anew
each epoch from a process whose other threads run torch code.

For each way: the time from iter(loader) to the first batch, for the first
epoch and for a later one (median and [min, max] over the repeats), and the
memory of one worker (its unique set size, from /proc/PID/smaps_rollup: what
it adds to the machine), in a process that has imported torch and holds a
model of --model-mib MiB (what a notebook that trains beside its producer
holds).

    python benchmarks/worker_start.py [--repeats 5] [--workers 2] [--model-mib 256]

Prints a table.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Rows(Dataset):
    """Tiny samples: the loader's time is its workers' start."""

    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((8,), float(i))


def uss_mib(pid: int) -> float:
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
                fields[parts[0][:-1]] = int(parts[1])
    return (fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)) / 1024


def one_way(context: str | None, persistent: bool, workers: int, epochs: int = 3):
    loader = DataLoader(Rows(), batch_size=32, num_workers=workers, persistent_workers=persistent,
                        multiprocessing_context=context)
    firsts, memory = [], 0.0
    for _ in range(epochs):
        began = time.perf_counter()
        it = iter(loader)
        next(it)
        firsts.append(time.perf_counter() - began)
        memory = statistics.mean(uss_mib(w.pid) for w in it._workers)
        for _ in it:
            pass
    del it, loader
    return firsts[0], statistics.median(firsts[1:]), memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--model-mib", type=int, default=256)
    args = parser.parse_args()
    model = torch.nn.Linear(1024, args.model_mib * 256)  # ~model_mib MiB of float32 weights
    ways = [("fork, each epoch (DataLoader's default)", "fork", False),
            ("fork once (persistent_workers=True)", "fork", True),
            ("forkserver, each epoch", "forkserver", False),
            ("forkserver once (persistent_workers=True)", "forkserver", True),
            ("spawn, each epoch", "spawn", False)]
    rows = []
    for label, context, persistent in ways:
        runs = [one_way(context, persistent, args.workers) for _ in range(args.repeats)]
        rows.append((label, [r[0] for r in runs], [r[1] for r in runs], [r[2] for r in runs]))
    print(f"DataLoader workers: {args.workers}; torch {torch.__version__}; a {args.model_mib} MiB model in the "
          f"process; {args.repeats} repeats; {multiprocessing.cpu_count()} CPUs")
    print(f"{'how workers start':44} {'first epoch: s to 1st batch':>30} {'later epoch':>24} {'worker USS MiB':>16}")

    def cell(values, digits=3):
        return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}, {max(values):.{digits}f}]"

    for label, first, later, memory in rows:
        print(f"{label:44} {cell(first):>30} {cell(later):>24} {statistics.median(memory):>16.1f}")
    del model


if __name__ == "__main__":
    main()

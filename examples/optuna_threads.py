"""Optuna trials as threads of one process (``study.optimize(n_jobs=K)``), all
fed by one batchcast producer in a process of its own, then the same trials
with a DataLoader each, for comparison.

    pip install optuna
    python examples/optuna_threads.py [--trials 4] [--epochs 2] [--samples 1024] [--workers 2] [--no-compare]

Trials that run as threads of one process (Optuna's ``n_jobs``), or in the
daemonic worker processes of ``multiprocessing.Pool`` and joblib, get no
DataLoader workers: a daemonic process may not start children ("daemonic
processes are not allowed to have children"), and forking workers from a
process whose other threads run risks deadlocks in the children (Python 3.12
warns of it). Each trial then loads its data on
its own thread, and decodes every sample of every epoch again.

Here ``batchcast serve`` runs the loader (with ``--workers`` workers) in a
process beside the study; every trial thread iterates
``bc.Consumer(NAME, batch_size=<its own>)``: each batch is made once for all
trials. The comparison runs the very same parameters with
``DataLoader(num_workers=0)`` per trial. Prints what every trial saw (each
sample once per epoch), its loss, and the wall and CPU time of both ways.
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

import batchcast as bc
from batchcast.synthetic import SyntheticImages

try:
    import optuna
except ImportError:
    sys.exit("this example needs optuna: pip install optuna")

NAME = "optuna-threads"
BATCH_SIZES = [16, 32, 64]


def loader(samples: str, size: str, workers: str) -> DataLoader:
    """The producer's loader (``batchcast serve`` calls it with the strings after ``--``)."""
    return DataLoader(SyntheticImages(int(samples), size=int(size)), batch_size=64, shuffle=True,
                      num_workers=int(workers), persistent_workers=int(workers) > 0)


def model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, 10))


def train(batches, lr: float, epochs: int, samples: int) -> tuple[float, bool]:
    """Trains a fresh model for `epochs` epochs of `batches`; returns the last
    epoch's mean loss and whether every epoch held every sample once."""
    torch.manual_seed(0)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    every_sample_once = True
    loss_sum = 0.0
    for _ in range(epochs):
        seen: list[int] = []
        loss_sum, steps = 0.0, 0
        for image, label, index in batches:
            loss = nn.functional.cross_entropy(net(image), label)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum, steps = loss_sum + loss.item(), steps + 1
            seen += index.tolist()
        every_sample_once &= sorted(seen) == list(range(samples))
        loss_sum /= max(steps, 1)
    return loss_sum, every_sample_once


def cpu_seconds() -> float:
    """User + system CPU of this process and of its children that ended."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def study(args: argparse.Namespace, shared: bool, params: list[dict] | None) -> tuple[optuna.Study, list[dict]]:
    """One study of args.trials trials, all running at once as threads."""
    results: list[dict] = []
    lock = threading.Lock()

    def objective(trial: optuna.Trial) -> float:
        lr = trial.suggest_float("lr", 1e-3, 0.3, log=True)
        batch_size = trial.suggest_categorical("batch_size", BATCH_SIZES)
        if shared:
            # The one line: the producer's batches, in this trial's batch size.
            batches = bc.Consumer(NAME, batch_size=batch_size)
        else:
            batches = DataLoader(SyntheticImages(args.samples, size=args.size), batch_size=batch_size,
                                 shuffle=True, num_workers=0)  # no workers in a trial thread
        try:
            loss, once = train(batches, lr, args.epochs, args.samples)
        finally:
            if shared:
                batches.close()
        with lock:
            results.append({"lr": lr, "batch_size": batch_size, "loss": loss, "every_sample_once": once})
        return loss

    s = optuna.create_study(direction="minimize", sampler=optuna.samplers.RandomSampler(seed=args.seed))
    for p in params or []:  # the comparison: the very same parameters
        s.enqueue_trial(p)
    # n_jobs = trials: every trial at once, as threads of this process.
    s.optimize(objective, n_trials=args.trials, n_jobs=args.trials)
    return s, sorted(results, key=lambda r: (r["lr"], r["batch_size"]))


def serve(args: argparse.Namespace) -> subprocess.Popen:
    """``batchcast serve`` of this file's loader, in a process of its own: it
    serves args.epochs epochs, starting once every trial has connected."""
    command = [sys.executable, "-m", "batchcast", "serve", f"{Path(__file__).resolve()}:loader", "--name", NAME,
               "--epochs", str(args.epochs), "--min-consumers", str(args.trials), "--refresh", "0", "--",
               str(args.samples), str(args.size), str(args.workers)]
    return subprocess.Popen(command)


def show(title: str, results: list[dict]) -> None:
    print(title)
    print(f"  {'lr':>8} {'batch':>5} {'loss':>7}  every sample once per epoch")
    for r in results:
        print(f"  {r['lr']:8.4f} {r['batch_size']:5d} {r['loss']:7.4f}  {r['every_sample_once']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4, help="trials, all at once (Optuna's n_jobs)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=1024, help="samples per epoch")
    parser.add_argument("--size", type=int, default=128, help="image side")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="the producer's loader workers")
    parser.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    parser.add_argument("--no-compare", action="store_true", help="skip the DataLoader-per-trial study")
    args = parser.parse_args()
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("batchcast").setLevel(logging.WARNING)

    cpu, start = cpu_seconds(), time.perf_counter()
    producer = serve(args)
    try:
        shared_study, shared = study(args, shared=True, params=None)
    finally:
        status = producer.wait(timeout=120)
    if status != 0:
        sys.exit(f"the producer (batchcast serve) exited with status {status}")
    wall_shared, cpu_shared = time.perf_counter() - start, cpu_seconds() - cpu
    show(f"{args.trials} Optuna trials as threads of one process, fed by one producer "
         f"({args.workers} workers) in a process beside them:", shared)
    best = shared_study.best_trial
    print(f"best: lr={best.params['lr']:.4g}, batch_size={best.params['batch_size']}, loss {best.value:.4f}")
    if not all(r["every_sample_once"] for r in shared):
        sys.exit("a trial fed by the producer did not see every sample once per epoch")
    if args.no_compare:
        return

    cpu, start = cpu_seconds(), time.perf_counter()
    _, own = study(args, shared=False, params=[t.params for t in shared_study.trials])
    wall_own, cpu_own = time.perf_counter() - start, cpu_seconds() - cpu
    show("the same trials, a DataLoader each (num_workers=0, as in a trial thread):", own)
    per_sample = args.trials * args.epochs * args.samples
    print(f"{'':14}{'wall':>9} {'trials/hour':>12} {'CPU':>9} {'CPU ms/sample':>14}")
    for label, wall, cpu_s in (("batchcast", wall_shared, cpu_shared), ("dataloader", wall_own, cpu_own)):
        print(f"{label:14}{wall:8.1f}s {3600 * args.trials / wall:12.0f} {cpu_s:8.1f}s "
              f"{1000 * cpu_s / per_sample:14.2f}")
    print(f"saved by sharing: wall {wall_own - wall_shared:.1f} s ({wall_own / wall_shared:.2f}x trials/hour), "
          f"CPU {cpu_own - cpu_shared:.1f} s")


if __name__ == "__main__":
    main()

"""A hyperparameter sweep with plain subprocesses, every trial fed by one
batchcast producer that runs beside it (in a thread of this script), then the
same trials with a DataLoader each, for comparison.

    python examples/sweep_script.py [--trials 4] [--epochs 2] [--samples 1024] [--no-compare]

Each trial is examples/sweep_trial.py with its own learning rate and batch
size. The decoding and augmentation work (batchcast's synthetic image
pipeline) runs once for the whole sweep instead of once per trial. Prints each
trial's result, then the wall time and CPU time of the sweep both ways and
what sharing saved. CPU time is this process (the producer and its loader
workers) plus every trial process and their workers.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader

import batchcast as bc
from batchcast.synthetic import SyntheticImages

HERE = Path(__file__).resolve().parent
LEARNING_RATES = [0.1, 0.03, 0.01, 0.003]
BATCH_SIZES = [32, 64, 48, 100]


def trial_params(trials: int) -> list[dict[str, Any]]:
    return [{"lr": LEARNING_RATES[i % len(LEARNING_RATES)],
             "batch_size": BATCH_SIZES[i % len(BATCH_SIZES)]} for i in range(trials)]


def add_size_arguments(parser: argparse.ArgumentParser, trials: int = 4) -> None:
    parser.add_argument("--trials", type=int, default=trials, help="trials, all at once")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=1024, help="samples per epoch")
    parser.add_argument("--size", type=int, default=64, help="image side")
    parser.add_argument("--workers", type=int, default=1,
                        help="DataLoader workers: the producer's, and each trial's own "
                             "when compared")
    parser.add_argument("--no-compare", action="store_true",
                        help="skip the run where each trial has its own DataLoader")


def make_loader(args: argparse.Namespace) -> DataLoader:
    """The pipeline every trial would otherwise run for itself."""
    return DataLoader(SyntheticImages(args.samples, size=args.size), batch_size=64,
                      num_workers=args.workers)


def cpu_seconds() -> float:
    """CPU time of this process and of its children that have been waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class Trials:
    """Runs trials as subprocesses (examples/sweep_trial.py); output in a temp folder."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dir = Path(tempfile.mkdtemp(prefix="batchcast-sweep-"))
        self.count = 0

    def start(self, params: dict[str, Any], data: str | None) -> tuple[subprocess.Popen, Path]:
        self.count += 1
        out = self.dir / f"trial{self.count}.json"
        cmd = [sys.executable, str(HERE / "sweep_trial.py"), "--lr", str(params["lr"]),
               "--batch-size", str(params["batch_size"]), "--epochs", str(self.args.epochs),
               "--samples", str(self.args.samples), "--size", str(self.args.size),
               "--workers", str(self.args.workers), "--out", str(out)]
        if data:
            cmd += ["--data", data]
        with open(self.dir / f"trial{self.count}.log", "w") as log:
            return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), out

    def finish(self, proc: subprocess.Popen, out: Path, on_failure: Callable[[], None]) -> dict:
        """Waits for one trial; on failure calls on_failure (which stops the
        producer, so that the other trials end too) and raises."""
        _, status, usage = os.wait4(proc.pid, 0)  # as proc.wait(), with the trial's CPU time
        code = proc.returncode = os.waitstatus_to_exitcode(status)
        if code != 0 or not out.exists():
            on_failure()
            log = Path(str(out)[:-len(".json")] + ".log").read_text()
            raise RuntimeError(f"trial ({' '.join(proc.args[2:6])}) exited with {code}:\n{log}")
        result = json.loads(out.read_text())
        result["cpu"] = usage.ru_utime + usage.ru_stime  # with its loader workers, if any
        return result


def shared_sweep(args: argparse.Namespace, run_all: Callable[[str, Callable[[], None]], list[dict]]
                 ) -> tuple[list[dict], float, float]:
    """One producer beside the sweep; run_all(name, on_failure) runs the
    trials. Returns their results, the wall seconds and the CPU seconds."""
    name = f"sweep-{os.getpid()}"
    wall, cpu = time.perf_counter(), cpu_seconds()
    # min_consumers: the first epoch starts once every trial has joined, so
    # that each sees every epoch from its start.
    producer = bc.Producer(make_loader(args), name, epochs=args.epochs, min_consumers=args.trials)
    stopping = threading.Lock()

    def on_failure() -> None:  # a trial failed: end the others' epochs too
        if stopping.acquire(blocking=False):
            producer.stop()

    with producer:
        results = run_all(name, on_failure)
    return results, time.perf_counter() - wall, cpu_seconds() - cpu


def own_loader_sweep(run_all: Callable[[None, Callable[[], None]], list[dict]]
                     ) -> tuple[list[dict], float, float]:
    wall, cpu = time.perf_counter(), cpu_seconds()
    results = run_all(None, lambda: None)
    return results, time.perf_counter() - wall, cpu_seconds() - cpu


def print_results(title: str, results: list[dict]) -> None:
    print(f"\n{title}")
    print(f"{'lr':>8} {'batch':>6} {'loss':>8} {'exactly once':>13} {'train s':>8} {'CPU s':>6}")
    for r in results:
        print(f"{r['lr']:>8.3g} {r['batch_size']:>6} {r['loss']:>8.4f} "
              f"{str(r['exactly_once']):>13} {r['seconds']:>8.2f} {r['cpu']:>6.2f}")


def print_savings(args: argparse.Namespace, shared: tuple, own: tuple | None) -> None:
    results, wall, cpu = shared
    trials_cpu = sum(r["cpu"] for r in results)
    print(f"\nsweep of {args.trials} trials x {args.epochs} epochs x {args.samples} images "
          f"({args.size}x{args.size}):")
    print(f"  one shared producer  : wall {wall:7.2f} s   CPU {cpu:7.2f} s "
          f"(trials {trials_cpu:.2f} s, producer and its loader {cpu - trials_cpu:.2f} s)")
    if own is None:
        return
    _, own_wall, own_cpu = own
    print(f"  a DataLoader each    : wall {own_wall:7.2f} s   CPU {own_cpu:7.2f} s")
    print(f"  saved by sharing     : wall {own_wall - wall:7.2f} s "
          f"({(own_wall - wall) / own_wall:.0%})   CPU {own_cpu - cpu:7.2f} s "
          f"({(own_cpu - cpu) / own_cpu:.0%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_size_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    params = trial_params(args.trials)
    trials = Trials(args)

    def run_all(data: str | None, on_failure: Callable[[], None]) -> list[dict]:
        started = [trials.start(p, data) for p in params]   # all at once, as a sweep runs them
        return [trials.finish(proc, out, on_failure) for proc, out in started]

    shared = shared_sweep(args, run_all)
    print_results("trials fed by one batchcast producer:", shared[0])
    own = None
    if not args.no_compare:
        own = own_loader_sweep(run_all)
        print_results("the same trials, each with its own DataLoader:", own[0])
    print_savings(args, shared, own)
    if not all(r["exactly_once"] for r in shared[0]):
        sys.exit("a trial missed or repeated samples")


if __name__ == "__main__":
    main()

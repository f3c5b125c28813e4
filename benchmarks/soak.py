"""Soak: stream many batches while consumers join, leave and crash at random;
report the producer's RSS, fds and threads over time (they must stay flat).

    python benchmarks/soak.py [--batches 100000] [--seed 0]

Not a test: it runs for minutes. Results also go to benchmarks/results/soak.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

import batchcast as bc

CONSUMER = """
import sys, time, random, batchcast as bc
rng = random.Random(int(sys.argv[3]))
c = bc.Consumer(sys.argv[1], batch_size=int(sys.argv[2]), timeout=60)
deadline = time.monotonic() + rng.uniform(1, 6)
while time.monotonic() < deadline:
    for batch in c:
        if time.monotonic() > deadline:
            break
if rng.random() < 0.5:
    c.close()  # a clean leave; otherwise just exit (garbage collection leaves)
"""


class Loader:
    """Endless-enough stream of small float batches with sample ids."""

    def __init__(self, batches_per_epoch: int):
        self.n = batches_per_epoch

    def __iter__(self):
        x = torch.rand(32, 3, 16, 16)
        for i in range(self.n):
            yield x, torch.arange(i * 32, i * 32 + 32)


def rss_kb() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault("BATCHCAST_RUNTIME_DIR", tempfile.mkdtemp(prefix="batchcast-soak-"))
    rng = random.Random(args.seed)
    name = f"soak-{os.getpid()}"
    producer = bc.Producer(Loader(500), name, epochs=None, slots=8).start()
    stop = threading.Event()
    children: list[subprocess.Popen] = []

    def churn() -> None:  # keep 1-4 consumers alive; kill some with SIGKILL
        k = 0
        while not stop.is_set():
            children[:] = [p for p in children if p.poll() is None]
            while len(children) < rng.randint(1, 4):
                k += 1
                children.append(subprocess.Popen(
                    [sys.executable, "-c", CONSUMER, name, str(rng.choice([16, 32, 50, 100])),
                     str(k)], stderr=subprocess.DEVNULL))
            if children and rng.random() < 0.3:
                rng.choice(children).send_signal(signal.SIGKILL)
            time.sleep(rng.uniform(0.5, 2.0))

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    samples = []
    started = time.monotonic()
    while True:
        stats = producer.stats()
        samples.append({
            "seconds": round(time.monotonic() - started, 1),
            "batches": stats["batches_published"],
            "rss_mb": round(rss_kb() / 1024, 1),
            "fds": len(os.listdir("/proc/self/fd")),
            "threads": threading.active_count(),
            "joins": stats["joins"], "leaves": stats["leaves"], "crashes": stats["crashes"],
        })
        print(json.dumps(samples[-1]), flush=True)
        if stats["batches_published"] >= args.batches:
            break
        time.sleep(5)
    stop.set()
    thread.join()
    for p in children:
        p.kill()
        p.wait()
    producer.stop()
    first = samples[min(2, len(samples) - 1)]  # after warm-up
    last = samples[-1]
    print(f"\n{last['batches']} batches in {last['seconds']} s; joins {last['joins']}, "
          f"leaves {last['leaves']}, crashes {last['crashes']}")
    print(f"producer RSS {first['rss_mb']} MB -> {last['rss_mb']} MB, fds {first['fds']} -> "
          f"{last['fds']}, threads {first['threads']} -> {last['threads']}")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "soak.json").write_text(json.dumps(samples, indent=1))


if __name__ == "__main__":
    main()

"""A late joiner through each door: how long a trainer that connects halfway
through an epoch waits for its first batch, where its epochs begin, and
whether the loader's workers wrote batches in place — `bc.Producer(loader)`
in a process against `batchcast serve` (`--doors ... tensorsocket` adds the
TensorSocket shim, which serves until its trainers are gone).

    python benchmarks/doors.py [--repeats 3] [--epoch-seconds 5]

A shuffled DataLoader with 2 workers over a dataset that takes a fixed time
per sample (an epoch of about --epoch-seconds); trainer A starts with the
producer, trainer B half an epoch later. Prints a table (median [min, max]
over the repeats) and writes benchmarks/results/doors.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SAMPLES, LOADER_BATCH = 640, 16

LOADERS = textwrap.dedent("""
    import time
    import torch
    from torch.utils.data import DataLoader, Dataset


    class Slow(Dataset):
        def __init__(self, n, seconds):
            self.n, self.seconds = n, seconds

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            time.sleep(self.seconds)
            return torch.full((3, 32, 32), float(i)), i


    def slow(n, seconds):
        return DataLoader(Slow(int(n), float(seconds)), batch_size={batch}, shuffle=True,
                          num_workers=2, generator=torch.Generator().manual_seed(0))
""").format(batch=LOADER_BATCH)

PRODUCE = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import batchcast as bc
    import doorloaders
    loader = doorloaders.slow(sys.argv[3], sys.argv[4])
    if sys.argv[5] == "producer":
        bc.Producer(loader, sys.argv[2], epochs=2).run()
    else:
        from batchcast.compat.tensorsocket import TensorProducer
        p = TensorProducer(loader, int(sys.argv[2].rsplit("-", 1)[1]))
        for _ in range(2):
            for _ in p:
                pass
        p.join()
""")

TRAIN = textwrap.dedent("""
    import json, sys, time
    import batchcast as bc
    asked = time.monotonic()
    consumer = bc.Consumer(sys.argv[1], batch_size=32)
    first = None
    for batch in consumer:
        if first is None:
            first = time.monotonic() - asked
            if sys.argv[2] == "late":
                break
    print(json.dumps({"first_batch": first, "joined_at": consumer.stats()["joined_at"]}))
""")


def status(name: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "batchcast", "status", name, "--json"],
                         capture_output=True, text=True, timeout=30)
    listings = json.loads(out.stdout or "[]")
    return (listings[0].get("status") or {}) if listings else {}


def once(door: str, tmp: Path, per_sample: float, epoch_seconds: float) -> dict:
    name = "tensorsocket-7000" if door == "tensorsocket" else f"doors-{door}"
    if door == "serve":
        producer = subprocess.Popen(
            [sys.executable, "-m", "batchcast", "serve", f"{tmp / 'doorloaders.py'}:slow",
             "--name", name, "--epochs", "2", "--refresh", "0", "--", str(SAMPLES), str(per_sample)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        producer = subprocess.Popen(
            [sys.executable, str(tmp / "produce.py"), str(tmp), name, str(SAMPLES), str(per_sample),
             "producer" if door == "bc.Producer" else "tensorsocket"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        first = subprocess.Popen([sys.executable, str(tmp / "train.py"), name, "whole"],
                                 stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while status(name).get("batches_published", 0) == 0:  # the epoch has begun
            if time.monotonic() > deadline or producer.poll() is not None:
                raise RuntimeError(f"{door}: the producer did not begin serving")
            time.sleep(0.05)
        began = time.monotonic()
        time.sleep(epoch_seconds / 2)  # half an epoch on
        late = subprocess.run([sys.executable, str(tmp / "train.py"), name, "late"],
                              capture_output=True, text=True, timeout=120)
        joined_after = time.monotonic() - began
        seen = status(name)
        result = json.loads(late.stdout)
        first.communicate(timeout=120)
        producer.wait(120)
    finally:
        for p in (producer, first):
            if p.poll() is None:
                p.kill()
                p.wait()
    return {"first_batch_s": result["first_batch"], "joined_at": result["joined_at"],
            "batches_in_place": seen.get("batches_in_place", 0), "joined_at_s": joined_after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epoch-seconds", type=float, default=5.0)
    parser.add_argument("--doors", nargs="+", default=["bc.Producer", "serve"])
    parser.add_argument("--out", type=Path, default=HERE / "results" / "doors")
    args = parser.parse_args()
    per_sample = args.epoch_seconds * 2 / SAMPLES  # two workers
    runs: dict[str, list[dict]] = {d: [] for d in args.doors}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        os.environ["BATCHCAST_RUNTIME_DIR"] = str(tmp / "rt")
        (tmp / "rt").mkdir(mode=0o700)
        (tmp / "doorloaders.py").write_text(LOADERS)
        (tmp / "produce.py").write_text(PRODUCE)
        (tmp / "train.py").write_text(TRAIN)
        for r in range(args.repeats):  # doors alternated: A B A B
            for door in args.doors:
                runs[door].append(once(door, tmp, per_sample, args.epoch_seconds))
                print(f"repeat {r} {door}: {runs[door][-1]}", flush=True)

    def cell(values: list[float], fmt: str) -> str:
        return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]"

    lines = [f"A trainer joining half-way through a ~{args.epoch_seconds:.0f} s epoch "
             f"(shuffled DataLoader, 2 workers, {SAMPLES} samples in batches of {LOADER_BATCH}); "
             f"median [min, max] of {args.repeats}.", "",
             "| door | first batch after | joined_at | batches_in_place |",
             "|---|---|---|---|"]
    for door, rs in runs.items():
        lines.append(f"| {door} | {cell([r['first_batch_s'] for r in rs], '.2f')} s | "
                     f"{cell([r['joined_at'] for r in rs], '.0f')} | "
                     f"{cell([r['batches_in_place'] for r in rs], '.0f')} |")
    table = "\n".join(lines)
    print("\n" + table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(table + "\n\n`python benchmarks/doors.py`\n")
    args.out.with_suffix(".json").write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()

"""batchcast demo: one producer runs a CPU image pipeline once; three training
processes with different batch sizes train from it and report throughput.

    batchcast demo [--samples 3072] [--epochs 2]
    python examples/demo.py [--samples 3072] [--epochs 2] [--batch-sizes 32 64 100]

Each consumer checks that it saw every sample exactly once per epoch, in order.
Then (unless told not to) the same trainers run with a DataLoader each, for
comparison.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import shutil
import tempfile
import time
from typing import TYPE_CHECKING, Any, Sequence

import torch
from torch import nn
from torch.utils.data import DataLoader

import batchcast as bc
from batchcast.synthetic import SyntheticImages

if TYPE_CHECKING:
    from multiprocessing.context import SpawnContext
    from multiprocessing.process import BaseProcess
    from multiprocessing.queues import Queue

    # What a trainer reports: batch size, batches, seconds, saw every sample
    # exactly once, views, copies, last loss.
    Row = tuple[int, int, float, bool, int, int, float]


class DemoFailed(RuntimeError):
    """A trainer missed or repeated samples, or a process of the demo failed."""


def produce(name: str, samples: int, epochs: int, consumers: int) -> None:
    torch.set_num_threads(1)
    loader = DataLoader(SyntheticImages(samples), batch_size=64, num_workers=1)
    producer = bc.Producer(loader, name, device="cpu", epochs=epochs, min_consumers=consumers)
    producer.run()


def train(name: str | None, batch_size: int, epochs: int, samples: int,
          results: Queue[Row]) -> None:
    """One training process; name=None trains from its own DataLoader instead."""
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader: DataLoader[Any] | bc.Consumer
    if name is None:
        loader = DataLoader(SyntheticImages(samples), batch_size=batch_size, num_workers=1)
    else:
        loader = bc.Consumer(name, batch_size=batch_size)  # was: DataLoader(...)
    started = time.perf_counter()
    seen_all = True
    for _epoch in range(epochs):
        seen = []
        for images, labels, index in loader:
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            seen += index.tolist()
        seen_all &= seen == list(range(samples))
    elapsed = time.perf_counter() - started
    if isinstance(loader, DataLoader):  # name is None
        results.put((batch_size, len(loader) * epochs, elapsed, seen_all, 0, 0, loss.item()))
        return
    stats = loader.stats()
    loader.close()
    results.put((batch_size, stats["batches"], elapsed, seen_all,
                 stats["views"], stats["copies"], loss.item()))


def run(samples: int = 3072, epochs: int = 2, batch_sizes: Sequence[int] = (32, 64, 100),
        compare: bool = True) -> None:
    """Runs the demo, printing to stdout; raises DemoFailed if a check fails."""
    batch_sizes = list(batch_sizes)
    own_dir = None
    if not os.environ.get("BATCHCAST_RUNTIME_DIR"):
        own_dir = tempfile.mkdtemp(prefix="batchcast-demo-")
        os.environ["BATCHCAST_RUNTIME_DIR"] = own_dir  # inherited by the processes below
    try:
        _run(samples, epochs, batch_sizes, compare)
    finally:
        if own_dir is not None:
            del os.environ["BATCHCAST_RUNTIME_DIR"]
            shutil.rmtree(own_dir, ignore_errors=True)


def _run(samples: int, epochs: int, batch_sizes: list[int], compare: bool) -> None:
    name = f"demo-{os.getpid()}"
    ctx = mp.get_context("spawn")
    print(f"producer '{name}': {samples} synthetic 64x64 images per epoch, loader batch 64, "
          f"{epochs} epochs; consumers with batch sizes {batch_sizes}", flush=True)
    producer = ctx.Process(target=produce, args=(name, samples, epochs, len(batch_sizes)))
    rows = _trainers(ctx, [producer], name, samples, epochs, batch_sizes)
    print(f"\n{'batch size':>10} {'batches':>8} {'seconds':>8} {'samples/s':>10} "
          f"{'exactly once':>12} {'views':>6} {'copies':>6} {'last loss':>9}")
    for b, batches, elapsed, ok, views, copies, loss in sorted(rows):
        rate = samples * epochs / elapsed
        print(f"{b:>10} {batches:>8} {elapsed:>8.2f} {rate:>10.0f} {str(ok):>12} "
              f"{views:>6} {copies:>6} {loss:>9.3f}")
    if not all(r[3] for r in rows):
        raise DemoFailed("demo failed: a consumer missed or repeated samples")
    print("\nEvery consumer saw every sample exactly once per epoch; the pipeline ran once.",
          flush=True)
    if not compare:
        return
    print("\nThe same trainers, each with its own DataLoader (1 worker each, as above):",
          flush=True)
    alone = _trainers(ctx, [], None, samples, epochs, batch_sizes)

    def total(rs: list[Row]) -> float:
        return sum(samples * epochs / r[2] for r in rs)

    for b, _, elapsed, *_ in sorted(alone):
        print(f"{b:>10} {'':>8} {elapsed:>8.2f} {samples * epochs / elapsed:>10.0f}")
    print(f"\naggregate samples/s: batchcast {total(rows):.0f}, own loaders {total(alone):.0f} "
          f"({total(rows) / total(alone):.1f}x)", flush=True)


def _trainers(ctx: SpawnContext, helpers: list[BaseProcess], name: str | None, samples: int,
              epochs: int, batch_sizes: list[int]) -> list[Row]:
    """Runs one trainer per batch size (plus helpers); returns their result rows."""
    results: Queue[Row] = ctx.Queue()
    trainers = [ctx.Process(target=train, args=(name, b, epochs, samples, results))
                for b in batch_sizes]
    everyone = [*helpers, *trainers]
    for p in everyone:
        p.start()
    rows: list[Row] = []
    try:
        while len(rows) < len(trainers):
            try:
                rows.append(results.get(timeout=1))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in everyone):
                    raise DemoFailed("demo failed: a process exited with an error (see above)")
        for p in everyone:
            p.join(60)
        if any(p.exitcode != 0 for p in everyone):
            raise DemoFailed("demo failed: a process exited with an error (see above)")
    finally:
        for p in everyone:
            if p.is_alive():
                p.kill()
                p.join()
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="demo.py", description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3072)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 64, 100])
    parser.add_argument("--no-compare", action="store_true",
                        help="skip the run where each trainer has its own DataLoader")
    args = parser.parse_args(argv)
    try:
        run(args.samples, args.epochs, args.batch_sizes, compare=not args.no_compare)
    except DemoFailed as exc:
        raise SystemExit(str(exc)) from None


if __name__ == "__main__":
    main()

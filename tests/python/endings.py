"""Processes for the tests of how trial processes end and fork
(test_endings.py, test_forks.py), driven by command-line flags.

    python endings.py serve NAME --gate FILE [--epochs 3] [--samples 600]
    python endings.py steady NAME --out result.json [--epochs 3]
    python endings.py end NAME --how sys-exit --out result.json
    python endings.py forker NAME --how pool --out result.json

Sample i is (a row of 8 values i, i). The producer's loader (2 workers,
forked) holds back sample `--gate-at` of every epoch until the file `--gate`
exists, so a test decides when the stream moves: a trainer that joins before
is blocked in next() until then. Each trainer prints "joined" once it is a
member, "ending" just before it ends the way it was told, and checks every
value it takes.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

import batchcast as bc

WIDTH = 8


class Gated(Dataset):
    def __init__(self, n: int, gate: str, gate_at: int) -> None:
        self.n, self.gate, self.gate_at = n, gate, gate_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if i == self.gate_at:
            while not os.path.exists(self.gate):  # the test opens the gate (an event)
                time.sleep(0.005)
        return torch.full((WIDTH,), float(i)), i


def check(x: torch.Tensor, i: torch.Tensor) -> list[int]:
    ids = i.tolist()
    assert torch.equal(x, i.float().view(-1, 1).expand(-1, WIDTH)), f"wrong values for samples {ids[:4]}..."
    return ids


def say(what: str) -> None:
    print(what, flush=True)


def serve(args: argparse.Namespace) -> None:
    loader = DataLoader(Gated(args.samples, args.gate, args.gate_at), batch_size=32,
                        num_workers=2, persistent_workers=args.persistent)
    producer = bc.Producer(loader, args.name, epochs=args.epochs, min_consumers=args.min_consumers)
    try:
        producer.run()
    finally:
        print(json.dumps(producer.stats()), flush=True)


def steady(args: argparse.Namespace) -> None:
    """A trainer beside the one that ends: every epoch whole, in order."""
    consumer = bc.Consumer(args.name, batch_size=args.batch_size, timeout=60)
    say("joined")
    epochs = []
    for _ in range(args.epochs):
        seen: list[int] = []
        for x, i in consumer:
            seen += check(x, i)
        epochs.append(seen)
    consumer.close()
    Path(args.out).write_text(json.dumps({"epochs": epochs, "first": consumer.stats()["joined_at"]}))


class Augment:
    """A transform (on batchcast's threads) that says when it works on a
    sample past the first `after`: the batch fetched ahead of the loop."""

    def __init__(self, after: int) -> None:
        self.after, self.calls = after, 0
        self.lock = threading.Lock()
        self.entered = threading.Event()

    def __call__(self, sample: Any, generator: torch.Generator) -> Any:
        with self.lock:
            self.calls += 1
            ahead = self.calls > self.after
        if ahead:
            self.entered.set()
            time.sleep(0.02)  # a transform's work: the exit meets it mid-batch
        x, i = sample
        return x + 0 * torch.rand(x.shape, generator=generator), i


def end(args: argparse.Namespace) -> None:
    """A trainer that takes `--batches` batches mid-stream, then ends `--how`."""
    how = args.how
    if how.startswith("ddp"):
        return end_ddp(args)
    augment = Augment(args.batches * args.batch_size)
    transform = augment if how == "transform-mid-batch" else None
    consumer = bc.Consumer(args.name, batch_size=args.batch_size, timeout=60, transform=transform)
    # a second consumer, iterated in step with the first (same batch size)
    others = [iter(bc.Consumer(args.name, batch_size=args.batch_size, timeout=60))] \
        if how == "two-consumers" else []
    say("joined")
    if how in ("sigint-in-next", "sigterm-in-next"):
        say("ending")  # the test signals it while it waits in next() for the gate
        for x, i in consumer:
            check(x, i)
        raise AssertionError("the gate opened before the signal came")
    if how == "daemon-thread":
        took = threading.Event()
        kept: list[Any] = []

        # Batchcast's code only on the daemon thread, and every batch kept:
        # a tensor freed there (or any torch op) while the interpreter exits
        # can abort the process, torch's doing (its GIL release in code that
        # cannot unwind: see docs/limitations.md). Holding its slots, the
        # thread ends up waiting in next() when the main thread returns.
        def loop() -> None:
            for _ in range(args.epochs):
                for batch in consumer:
                    kept.append(batch)
                    if len(kept) == args.batches:
                        took.set()

        threading.Thread(target=loop, daemon=True).start()
        took.wait()
        for x, i in kept[:args.batches]:
            check(x, i)
        say("ending")
        return  # the interpreter exits with the daemon thread inside next() or its loop
    batches = 0
    for x, i in consumer:
        check(x, i)
        for other in others:
            check(*next(other))
        batches += 1
        if batches < args.batches:
            continue
        if how == "transform-mid-batch":
            augment.entered.wait()  # the next batch is being transformed ahead
        say("ending")
        if how in ("return", "two-consumers", "transform-mid-batch"):
            return  # with the consumers open, mid-epoch
        if how == "sys-exit":
            sys.exit(3)
        if how == "exception":
            raise RuntimeError("the training step failed")
        if how == "os-exit":
            os._exit(7)
        raise ValueError(f"unknown --how {how}")


def end_ddp(args: argparse.Namespace) -> None:
    """One rank of a 2-rank DDP trial (gloo) that ends after `--batches`:
    ddp-group-first destroys the process group before closing its consumer,
    ddp-consumer-first after."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{args.store}", rank=args.rank, world_size=2)
    consumer = bc.Consumer(args.name, batch_size=args.batch_size, timeout=60, group="ddp")
    say("joined")
    net = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(WIDTH, 2))
    for k, (x, i) in enumerate(consumer):
        check(x, i)
        net(x).sum().backward()  # all-reduces with the other rank
        if k + 1 == args.batches:
            break
    del x, i  # (the consumer's connection closes with its last batch: its goodbye is sent then)
    say("ending")
    if args.how == "ddp-group-first":
        del net
        gc.collect()
        dist.destroy_process_group()
        consumer.close()
    else:
        consumer.close()
        del net
        gc.collect()
        dist.destroy_process_group()
    # As examples/ddp_trial.py: a rank leaves without the interpreter's
    # finalization, where a race of torch's gloo workers can abort it (see
    # exit_race/shim.cpp); batchcast's part is done by then (the consumer,
    # closed and dropped with its batches, has said goodbye).
    del consumer
    gc.collect()
    sys.stdout.flush()
    os._exit(0)


def forker(args: argparse.Namespace) -> None:
    """A trainer that forks while its consumer is open and holds batches: a
    validation DataLoader with workers (persistent or not), a fork that
    exits normally, a multiprocessing pool. Its own stream stays exact."""
    import multiprocessing

    consumer = bc.Consumer(args.name, batch_size=args.batch_size, timeout=60)
    say("joined")
    held: list[tuple[torch.Tensor, torch.Tensor]] = []
    valid = DataLoader(Gated(64, "", -1), batch_size=16, num_workers=2,
                       multiprocessing_context="fork", persistent_workers=args.how == "persistent")
    epochs, children = [], []
    for epoch in range(args.epochs):
        seen: list[int] = []
        for k, (x, i) in enumerate(consumer):
            seen += check(x, i)
            if k == 2:
                held.append((x, i))  # views of the ring, alive across the forks
                if args.how in ("validation", "persistent"):
                    got = [int(j) for _, js in valid for j in js]
                    assert got == list(range(64)), got
                elif args.how == "fork":
                    pid = os.fork()
                    if pid == 0:
                        child(consumer, held)
                    children.append(os.waitpid(pid, 0)[1])
                elif args.how == "pool":
                    with multiprocessing.get_context("fork").Pool(2) as pool:
                        assert pool.map(abs, range(-8, 0)) == list(range(8, 0, -1))
        epochs.append(seen)
    for x, i in held:
        check(x, i)
    consumer.close()
    Path(args.out).write_text(json.dumps({"epochs": epochs, "children": children}))


def child(consumer: bc.Consumer, held: list[Any]) -> None:
    """In a forked child of a trainer: using the parent's consumer is a clear
    error; its batches are readable copies; dropping them and exiting the
    normal way (finalizers, atexit) touches nothing of the parent's."""
    code = 0
    try:
        consumer.stats()
        code = 10
    except bc.Error as exc:
        if "is a fork of it" not in str(exc):
            code = 11
    try:
        next(iter(consumer))
        code = 12
    except bc.Error:
        pass
    for x, i in held:
        check(x, i)
    held.clear()
    gc.collect()
    sys.exit(code)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["serve", "steady", "end", "forker"])
    parser.add_argument("name")
    parser.add_argument("--out", default="")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=600)
    parser.add_argument("--gate", default="")
    parser.add_argument("--gate-at", type=int, default=300)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--min-consumers", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--how", default="return")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--store", default="")
    args = parser.parse_args()
    torch.set_num_threads(1)
    {"serve": serve, "steady": steady, "end": end, "forker": forker}[args.role](args)


if __name__ == "__main__":
    if os.environ.get("BATCHCAST_TEST_DEFAULT_SIGINT"):
        signal.signal(signal.SIGINT, signal.default_int_handler)
    main()

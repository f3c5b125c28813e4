"""A data-parallel trial (DDP over CPU processes, gloo) training beside a
single-process trial, both fed by one batchcast producer.

    python examples/ddp_trial.py                  # 2 ranks + 1 single trial, 2 epochs
    python examples/ddp_trial.py --world 3 --epochs 3 --samples 1000

The DDP trial's ranks are one consumer group: each passes
``group="ddp-trial"`` (rank and world size come from torch.distributed), so of
each ``world * batch_size`` consecutive samples of the stream, rank r trains
on the r-th ``batch_size``: together the ranks see every sample of an epoch
once, while the single trial beside them sees all of it with its own batch
size. Every rank gets the same number of batches (the last, partial window is
padded with the epoch's first samples), so DDP's all-reduces never wait for a
rank that ran out. Prints what each trial saw and checks it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader

import batchcast as bc
from batchcast.synthetic import SyntheticImages

NAME = "ddp-example"


def model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, 10))


def ddp_rank(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    """One rank of the data-parallel trial; writes what it saw to out.format(rank)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    loader = bc.Consumer(NAME, batch_size=args.batch_size, group="ddp-trial")  # the one line
    net = nn.parallel.DistributedDataParallel(model())
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    epochs = []
    images = labels = index = None
    for _ in range(args.epochs):
        seen, batches, loss_sum = [], 0, 0.0
        for images, labels, index in loader:
            loss = nn.functional.cross_entropy(net(images), labels)
            optimizer.zero_grad()
            loss.backward()  # all-reduces with the other ranks
            optimizer.step()
            loss_sum += loss.item()
            seen += index.tolist()
            batches += 1
        epochs.append({"seen": seen, "batches": batches, "loss": loss_sum / max(batches, 1)})
    # Closed, and dropped with its last batch: its connection closes, and the
    # producer hears the goodbye before this process leaves (below).
    loader.close()
    del loader, images, labels, index
    dist.destroy_process_group()
    Path(out.format(rank)).write_text(json.dumps({"rank": rank, "epochs": epochs}))
    # torch (2.13, with CPython 3.11) can abort a DDP process at exit: the
    # process group outlives destroy_process_group, and a gloo worker thread
    # that lets go of the last all-reduce late frees a Python object autograd
    # put in it (a contextvars.Context) while the interpreter finalizes; it
    # takes the GIL, CPython ends the thread (pthread_exit) inside a noexcept
    # destructor, and the process dies with "terminate called without an
    # active exception". Everything is done and written: leave without the
    # interpreter's finalization (tests/python/exit_race forces that race).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def single_trial(args: argparse.Namespace, out: str) -> None:
    """A trial of one process beside it, with its own batch size."""
    torch.set_num_threads(1)
    loader = bc.Consumer(NAME, batch_size=args.single_batch_size)
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    epochs = []
    for _ in range(args.epochs):
        seen = []
        for images, labels, index in loader:
            loss = nn.functional.cross_entropy(net(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen += index.tolist()
        epochs.append({"seen": seen})
    loader.close()
    Path(out).write_text(json.dumps({"epochs": epochs}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2, help="ranks of the DDP trial")
    parser.add_argument("--batch-size", type=int, default=16, help="each rank's")
    parser.add_argument("--single-batch-size", type=int, default=48)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=500, help="samples per epoch")
    parser.add_argument("--size", type=int, default=32, help="image side")
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="batchcast-ddp-")
    loader = DataLoader(SyntheticImages(args.samples, size=args.size), batch_size=64,
                        num_workers=1)
    ctx = mp.get_context("spawn")
    # min_consumers=2: the DDP trial (a group counts once) and the single trial.
    with bc.Producer(loader, NAME, epochs=args.epochs, min_consumers=2):
        single = ctx.Process(target=single_trial, args=(args, os.path.join(work, "single.json")))
        single.start()
        mp.start_processes(ddp_rank, args=(args.world, free_port(), args,
                                           os.path.join(work, "rank{}.json")),
                           nprocs=args.world, start_method="spawn", join=False).join()
        single.join()
    ranks = [json.loads(Path(work, f"rank{r}.json").read_text()) for r in range(args.world)]
    whole = list(range(args.samples))
    ok = True
    print(f"one producer, {args.samples} samples per epoch; DDP trial: {args.world} ranks x "
          f"batch {args.batch_size}; single trial: batch {args.single_batch_size}")
    for e in range(args.epochs):
        counts = [r["epochs"][e]["batches"] for r in ranks]
        seen = [i for r in ranks for i in r["epochs"][e]["seen"]]
        single_seen = json.loads(Path(work, "single.json").read_text())["epochs"][e]["seen"]
        disjoint_and_whole = sorted(set(seen)) == whole and len(seen) - args.samples < args.world
        same_count = len(set(counts)) == 1
        exactly_once = sorted(single_seen) == whole
        ok &= disjoint_and_whole and same_count and exactly_once
        losses = ", ".join(f"{r['epochs'][e]['loss']:.3f}" for r in ranks)
        print(f"epoch {e}: ranks' batches {counts} (same: {same_count}); together every sample "
              f"{'once' if disjoint_and_whole else 'NOT once'} (+{len(seen) - args.samples} "
              f"padding); single trial: every sample {'once' if exactly_once else 'NOT once'}; "
              f"ranks' loss {losses}")
    sys.exit(0 if ok else "a trial did not see what it should")


if __name__ == "__main__":
    main()

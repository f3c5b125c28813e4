"""Producer and consumer processes for the GPU tests (test_gpu.py).

    python gpu_workers.py produce NAME --device cuda:0 --samples 1003 --loader-batch 32
    python gpu_workers.py consume NAME --batch-size 48 --out result.json

Sample i is (image = arange(12).view(3, 2, 2) + i / 2, label = i). A consumer
checks order, uniqueness and content, and, per batch, whether every tensor
lies inside the ring it imported (stats()["ring_address"], ["ring_bytes"]) and
what torch's caching allocator holds on its GPU. It writes one JSON result.

Events instead of sleeps: a producer can create a file when its loader is asked
for a given batch (--mark-at EPOCH:INDEX --mark FILE), a consumer when it holds
a number of batches (--held-after K --held FILE), and a consumer can wait for a
file before it checks and lets go of what it kept (--wait-for FILE).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import batchcast as bc


def expected_image(i: int) -> torch.Tensor:
    return torch.arange(12, dtype=torch.float32).view(3, 2, 2) + i * 0.5


class IdDataset(Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return expected_image(i), i


class MarkingLoader:
    """A DataLoader that creates `mark` when it is asked for batch `index` of
    epoch `epoch` (every earlier batch has been published by then), and
    `exhausted` when its last epoch ends."""

    def __init__(self, loader, epochs: int, mark_at: str, mark: str, exhausted: str):
        self.loader, self.epochs, self.mark, self.exhausted = loader, epochs, mark, exhausted
        self.mark_epoch, self.mark_index = (int(x) for x in mark_at.split(":")) if mark_at else (-1, -1)
        self.epoch = -1

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        self.epoch += 1
        for index, batch in enumerate(self.loader):
            if self.mark and (self.epoch, index) == (self.mark_epoch, self.mark_index):
                touch(self.mark)
            yield batch
        if self.exhausted and self.epoch + 1 >= self.epochs:
            touch(self.exhausted)


def touch(path: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.replace(tmp, path)  # appears whole


def wait_for_file(path: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def produce(args: argparse.Namespace) -> None:
    loader = DataLoader(IdDataset(args.samples), batch_size=args.loader_batch, num_workers=args.workers,
                        pin_memory=args.pin_memory)
    batches = MarkingLoader(loader, args.epochs, args.mark_at, args.mark, args.exhausted)
    producer = bc.Producer(batches, args.name, device=args.device, epochs=args.epochs,
                           min_consumers=args.min_consumers, slots=args.slots,
                           ring_bytes=args.ring_bytes)
    try:
        producer.run()
    finally:
        print(json.dumps(producer.stats()), flush=True)


def tensors(batch) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        return [t for v in batch.values() for t in tensors(v)]
    if isinstance(batch, (list, tuple)):
        return [t for v in batch for t in tensors(v)]
    return []


def check_values(batch) -> list[int]:
    images, labels = batch
    ids = labels.cpu().tolist()
    want = torch.stack([expected_image(i) for i in ids]) if ids else images.cpu()
    assert torch.equal(images.cpu(), want), "payload differs from its sample id"
    return ids


def record(result: dict, batch, stats: dict) -> None:
    """Whether every tensor of the batch lies inside the ring as mapped here."""
    ring = (int(stats.get("ring_address", 0)), int(stats.get("ring_bytes", 0)))
    if ring not in result["rings"]:
        result["rings"].append(ring)
    inside = True
    for t in tensors(batch):
        start, end = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
        ok = t.is_cuda and ring[0] != 0 and ring[0] <= start and end <= ring[0] + ring[1]
        result["tensors"] += 1
        result["tensors_in_ring"] += int(ok)
        if not ok:
            inside = False
            if result["outside_ring"] is None:
                result["outside_ring"] = {"device": str(t.device), "start": start, "end": end,
                                          "ring": list(ring), "batch": len(result["batches_all_in_ring"])}
    result["batches_all_in_ring"].append(inside)


def consume(args: argparse.Namespace) -> None:
    device = torch.device(args.device or "cuda:0")  # default: the producer's GPU in these tests
    on_gpu = device.type == "cuda"
    if on_gpu:
        # Make torch's caching allocator live before the first batch, so that
        # memory_allocated() counts anything torch allocates for a batch here.
        torch.cuda.set_device(device)
        torch.cuda.init()
    # Views of the ring (shared_gpu_views=True): what these tests look at; the
    # default private copies have their own tests (test_gpu_rules.py).
    consumer = bc.Consumer(
        args.name,
        batch_size=args.batch_size,
        drop_last=args.drop_last,
        timeout=args.timeout,
        device=bc.Placement(args.device or None, shared_gpu_views=args.views == "shared"),
    )
    result = {"epochs": [], "sizes": [], "error": None, "pid": os.getpid(),
              "tensors": 0, "tensors_in_ring": 0, "batches_all_in_ring": [],
              "outside_ring": None, "rings": [], "allocated_during": [],
              "held_signalled": False, "waited_for": None}
    kept = []
    everything = []  # --keep-all: every batch of every epoch, checked at the end
    result["max_wait"] = 0.0
    try:
        for _ in range(args.epochs):
            ids, sizes = [], []
            batches = iter(consumer)
            while True:
                asked = time.monotonic()
                batch = next(batches, None)
                if ids:  # the wait for each batch after the first of the epoch
                    result["max_wait"] = max(result["max_wait"], time.monotonic() - asked)
                if batch is None:
                    break
                record(result, batch, consumer.stats())
                if args.keep_all:
                    everything.append(batch)
                if on_gpu:  # while this batch is held
                    result["allocated_during"].append(torch.cuda.memory_allocated(device))
                batch_ids = check_values(batch) if args.check_values else batch[1].cpu().tolist()
                ids += batch_ids
                sizes.append(len(batch_ids))
                if args.keep:
                    kept.append(batch)
                if args.held and len(kept) >= args.held_after and not result["held_signalled"]:
                    touch(args.held)  # e.g. the ring is full now: everyone waits for us
                    result["held_signalled"] = True
            batch = None  # the loop variable would hold the last batch
            result["epochs"].append(ids)
            result["sizes"].append(sizes)
            if kept and args.wait_for:
                # Hold every batch of the epoch until the event, then check that
                # none was overwritten meanwhile.
                result["waited_for"] = wait_for_file(args.wait_for, args.timeout)
                for batch in kept:
                    check_values(batch)
                batch = None
            kept.clear()
        for batch in everything:  # none was overwritten while the producer went on
            check_values(batch)
        result["kept_all"] = len(everything)
    except Exception as exc:  # reported to the test, which asserts on it
        result["error"] = f"{type(exc).__name__}: {exc}"
    batch = None
    kept.clear()
    everything.clear()
    result["stats"] = consumer.stats()
    if on_gpu:
        result["max_memory_allocated"] = torch.cuda.max_memory_allocated(device)
        result["memory_allocated"] = torch.cuda.memory_allocated(device)
    consumer.close()
    with open(args.out, "w") as f:
        json.dump(result, f)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["produce", "consume"])
    parser.add_argument("name")
    parser.add_argument("--device", default="", help="producer: its ring (default cuda:0); consumer: where batches go")
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--loader-batch", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--pin-memory", action="store_true", help="producer: DataLoader(pin_memory=True)")
    parser.add_argument("--min-consumers", type=int, default=1)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--ring-bytes", type=int, default=0)
    parser.add_argument("--mark-at", default="", help="EPOCH:INDEX: create --mark when asked for that batch")
    parser.add_argument("--mark", default="")
    parser.add_argument("--exhausted", default="", help="file to create when the last epoch's loader ends")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--drop-last", action="store_true")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--check-values", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep every batch of an epoch")
    parser.add_argument("--keep-all", action="store_true",
                        help="keep every batch of every epoch, then check every value")
    parser.add_argument("--held-after", type=int, default=0)
    parser.add_argument("--held", default="", help="with --keep: file to create once --held-after batches are kept")
    parser.add_argument("--wait-for", default="", help="with --keep: file to wait for before checking kept batches")
    parser.add_argument("--views", choices=["shared", "copy"], default="shared",
                        help="consumer: shared_gpu_views=True (views of the ring), or private copies")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.role == "produce":
        args.device = args.device or "cuda:0"
        produce(args)
    else:
        consume(args)


if __name__ == "__main__":
    sys.exit(main())

"""Producer and consumer processes for the tests, driven by command-line flags.

    python workers.py produce NAME --samples 1003 --loader-batch 32 --epochs 2
    python workers.py consume NAME --batch-size 48 --epochs 2 --out result.json

Every sample i carries its id and values derived from it, so a consumer can
check order, uniqueness and content.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import batchcast as bc

Sample = collections.namedtuple("Sample", ["image", "label", "meta"])


def expected_image(i: int, width: int = 2) -> torch.Tensor:
    return (torch.arange(6 * width, dtype=torch.float32).view(3, 2, width) + i * 0.5)


class IdDataset(Dataset):
    """Sample i: (image derived from i, i, "file-i.jpg") in the chosen structure."""

    def __init__(self, n: int, kind: str = "tuple", fail_at: int = -1, bad_shape_at: int = -1,
                 width: int = 2):
        self.n, self.kind, self.fail_at, self.bad_shape_at = n, kind, fail_at, bad_shape_at
        self.width = width

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.fail_at:
            raise ValueError(f"corrupt sample {i}")
        image = expected_image(i, self.width)
        if self.bad_shape_at >= 0 and i >= self.bad_shape_at:
            image = torch.zeros(3, 3, 3)
        if self.kind == "tuple":
            return image, i
        if self.kind == "dict":
            return {"image": image, "id": i, "path": f"file-{i}.jpg", "extra": {"w": float(i)}}
        if self.kind == "namedtuple":
            return Sample(image, i, {"path": f"file-{i}.jpg", "flag": i % 2 == 0})
        if self.kind == "object":
            return image, object()
        raise ValueError(self.kind)


def sample_ids(batch) -> list[int]:
    if isinstance(batch, dict):
        return batch["id"].tolist()
    if isinstance(batch, Sample):
        return batch.label.tolist()
    return batch[1].tolist()


def check_values(batch) -> None:
    """Raises unless every sample's payload matches its id."""
    ids = sample_ids(batch)
    if isinstance(batch, dict):
        image = batch["image"]
        assert batch["path"] == [f"file-{i}.jpg" for i in ids], batch["path"]
        assert batch["extra"]["w"].tolist() == [float(i) for i in ids]
    elif isinstance(batch, Sample):
        image = batch.image
        assert batch.meta["path"] == [f"file-{i}.jpg" for i in ids]
        assert batch.meta["flag"].tolist() == [i % 2 == 0 for i in ids]
    else:
        image = batch[0]
    width = image.shape[-1]
    want = torch.stack([expected_image(i, width) for i in ids]) if ids else image.cpu()
    assert torch.equal(image.cpu(), want), "payload differs from its sample id"


def count_signals(sig: int) -> list[int]:
    """Installs a Python handler for `sig` (as a profiler or a scheduler
    would) and returns the one-item list it counts into."""
    received = [0]

    def handler(signum, frame):
        received[0] += 1

    signal.signal(sig, handler)
    return received


def stop_counting(sig: int) -> None:
    """Done: ignore `sig` from now on. (Python's own shutdown would put back
    the default action, which for SIGUSR1 is to terminate.)"""
    signal.signal(sig, signal.SIG_IGN)


def produce(args: argparse.Namespace) -> None:
    signals = count_signals(signal.SIGUSR1) if args.count_signals else None
    ds = IdDataset(args.samples, args.kind, args.fail_at, args.bad_shape_at, args.width)
    generator = torch.Generator().manual_seed(args.seed) if args.shuffle else None
    collate = None
    if args.kind == "object":  # default_collate refuses objects; pass them through as a list
        def collate(samples):
            return torch.stack([s[0] for s in samples]), [s[1] for s in samples]
    loader = DataLoader(ds, batch_size=args.loader_batch, shuffle=args.shuffle,
                        generator=generator, num_workers=args.workers, collate_fn=collate)
    producer = bc.Producer(loader, args.name, epochs=args.epochs, device=args.device or "cpu",
                           min_consumers=args.min_consumers, slots=args.slots,
                           ring_bytes=args.ring_bytes)
    if args.ready:
        open(args.ready, "w").close()  # serving, handler installed
    try:
        producer.run()
    finally:
        stats = producer.stats()
        if signals is not None:
            stats["signals"] = signals[0]
            stop_counting(signal.SIGUSR1)
        print(json.dumps(stats), flush=True)


def consume(args: argparse.Namespace) -> None:
    import warnings

    signals = count_signals(signal.SIGUSR1) if args.count_signals else None
    group = bc.Group(args.group, args.rank, args.world) if args.group else None
    state = None
    if args.state:
        with open(args.state) as f:
            state = json.load(f)
    seen_warnings: list[str] = []
    if args.record_warnings:  # into the result, instead of stderr
        def show(message, category, *_args, **_kwargs):
            seen_warnings.append(f"{category.__name__}: {message}")

        warnings.showwarning = show
    consumer = bc.Consumer(
        args.name,
        batch_size=args.batch_size or None,
        drop_last=args.drop_last,
        timeout=args.timeout,
        device=bc.Placement(args.device or None, writable=args.writable),
        state=state,
        group=group,
        join=args.late_join or ("catch_up" if args.catch_up else "next_epoch"),
    )
    result = {"len": None, "epochs": [], "sizes": [], "error": None, "pid": os.getpid(),
              "max_wait": 0.0}
    kept = []  # --keep: a user who stores batches instead of clones of them
    received = 0
    if args.ready and args.ready_after == 0:
        open(args.ready, "w").close()  # joined
    try:
        result["len"] = len(consumer)
    except TypeError:
        pass
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
                received += 1
                if args.ready and received == args.ready_after:
                    open(args.ready, "w").close()  # the producer is serving this consumer
                if args.check_values:
                    check_values(batch)
                ids += sample_ids(batch)
                sizes.append(len(sample_ids(batch)))
                if args.save_after and sum(map(sum, result["sizes"])) + sum(sizes) == \
                        args.save_after:
                    # A trial checkpointing, then stopping: the state goes with it.
                    with open(args.save_state, "w") as f:
                        json.dump(consumer.state_dict(), f)
                    result["epochs"].append(ids)
                    result["sizes"].append(sizes)
                    raise StopTraining
                if args.hold_at and received == args.hold_at:
                    # Holds this batch (and what is queued) until the file appears.
                    while not os.path.exists(args.until):
                        time.sleep(0.01)
                if args.keep:
                    kept.append(batch)
                if args.write_in_place:
                    batch[0].mul_(2)  # a bug: batches are shared and read-only (unless --writable)
                    if args.writable:  # then it may, and sees what it wrote
                        batch[0].div_(2)
                        check_values(batch)
                if args.sleep:
                    time.sleep(args.sleep)
            result["epochs"].append(ids)
            result["sizes"].append(sizes)
            result.setdefault("states", []).append(consumer.state_dict())
        # Every batch of every epoch is still referenced: none may have been
        # overwritten while the producer went on.
        for batch in kept:
            check_values(batch)
        result["kept"] = sum(len(sample_ids(b)) for b in kept)
    except StopTraining:
        pass
    except Exception as exc:  # reported to the test, which asserts on it
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["error_at"] = time.monotonic()
    result["stats"] = consumer.stats()
    result["warnings"] = seen_warnings
    if signals is not None:
        result["signals"] = signals[0]
        stop_counting(signal.SIGUSR1)
    batch = None  # the loop variable still held the last batch
    kept.clear()
    if str(result["stats"].get("device", "")).startswith("cuda"):
        # What this process's caching allocator holds once every batch is gone
        # (batchcast used CUDA from C++; the Python side may not know yet).
        torch.cuda.init()
        result["cuda_memory_allocated"] = torch.cuda.memory_allocated()
        result["cuda_max_memory_allocated"] = torch.cuda.max_memory_allocated()
    consumer.close()
    with open(args.out, "w") as f:
        json.dump(result, f)


class StopTraining(Exception):
    """--save-after: the trial stops here (its state saved)."""


def quiet() -> None:
    """What a user does to silence batchcast: ignore its warnings and give its
    logger a handler that drops records."""
    import logging
    import warnings

    warnings.simplefilter("ignore", bc.BatchcastWarning)
    logging.getLogger("batchcast").addHandler(logging.NullHandler())
    logging.getLogger("batchcast").propagate = False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["produce", "consume"])
    parser.add_argument("name")
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--loader-batch", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--kind", default="tuple")
    parser.add_argument("--shuffle", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--min-consumers", type=int, default=1)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--fail-at", type=int, default=-1)
    parser.add_argument("--bad-shape-at", type=int, default=-1)
    parser.add_argument("--batch-size", type=int, default=8, help="0: the loader's batches as they are")
    parser.add_argument("--drop-last", action="store_true")
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--check-values", action="store_true")
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--keep", action="store_true",
                        help="keep every batch to the end, then check every value")
    parser.add_argument("--width", type=int, default=2, help="sample images are 3 x 2 x width")
    parser.add_argument("--count-signals", action="store_true",
                        help="install a SIGUSR1 handler and report how many arrived")
    parser.add_argument("--device", default="", help="producer: where the ring is; consumer: where batches go")
    parser.add_argument("--ring-bytes", type=int, default=0)
    parser.add_argument("--write-in-place", action="store_true")
    parser.add_argument("--writable", action="store_true",
                        help="consumer: Consumer(device=bc.Placement(writable=True))")
    parser.add_argument("--ready", default="", help="file to create once joined (producer: serving)")
    parser.add_argument("--ready-after", type=int, default=0,
                        help="consumer: create --ready once this many batches arrived instead")
    parser.add_argument("--out", default="")
    parser.add_argument("--group", default="", help="consumer: the group of ranks it is one of")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--catch-up", action="store_true")
    parser.add_argument("--late-join", default="", choices=["", "now", "next_epoch", "catch_up"],
                        help="consumer: Consumer(join=...); default next_epoch (or --catch-up)")
    parser.add_argument("--save-after", type=int, default=0,
                        help="consumer: after this many samples, save state_dict() to --save-state "
                             "and stop")
    parser.add_argument("--save-state", default="")
    parser.add_argument("--state", default="", help="consumer: resume from this saved state")
    parser.add_argument("--hold-at", type=int, default=0,
                        help="consumer: at this batch, wait (holding it) until --until exists")
    parser.add_argument("--until", default="")
    parser.add_argument("--record-warnings", action="store_true",
                        help="consumer: warnings go into the result, not stderr")
    parser.add_argument("--quiet", action="store_true", help="silence batchcast's warnings and logs")
    args = parser.parse_args()
    if args.quiet:
        quiet()
    produce(args) if args.role == "produce" else consume(args)


if __name__ == "__main__":
    sys.exit(main())

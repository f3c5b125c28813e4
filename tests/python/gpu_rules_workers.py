"""Producer and consumer processes for test_gpu_rules.py: the GPU ring's rules,
checked where getting them wrong shows, on a real GPU or on the simulated
device (BATCHCAST_SIMULATED_CUDA, set by the test in each process's environment).

    python gpu_rules_workers.py produce NAME --memory pinned --sample-bytes 1048576
    python gpu_rules_workers.py consume NAME --check stream --out result.json

Sample i of epoch e is every int32 of its image equal to i + e * samples, and
its label i. Values depend on the epoch, so a slot read before its copy holds
a different batch's bytes (an earlier one's, or the previous epoch's).

The producer builds its own batches (no DataLoader): --memory pageable goes
through the ring's pinned staging; --memory pinned allocates each batch from
pinned memory that is handed out again as soon as it is freed (on a GPU,
torch's pinned-memory cache; on the simulated device, a cache that does the
same), so the ring copies it directly and must keep it until the copy is done.
--memory workers has a DataLoader's workers make the same batches, writing
them into the ring's pinned host mirror (in place).

A consumer checks values (--check):
  host    on the host right after next(): on the simulated device the default
          stream runs on the host, so this reads in stream order;
  stream  queued on the current stream without waiting on the host (on the
          simulated device, a stream whose work starts after random delays),
          slowed down first by --stream-delay-us (on a GPU a sleep kernel);
          the batch is dropped at once;
  side    like stream, on a side stream that waits for the current one
          (for release_after="device").
Mismatches are counted, never raised, and reported at the end.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import threading
import time

import torch

import batchcast as bc
from gpu_workers import touch, wait_for_file  # beside this file

SIMULATED = bc._C._testing.active()


# ---- the calling thread's CUDA context, as the driver (or the simulation) sees it ----
_libcuda = None


def current_context() -> int:
    """0: the calling thread has no current context; else an id of it."""
    if SIMULATED:
        return bc._C._testing.current_context()
    global _libcuda
    if _libcuda is None:
        _libcuda = ctypes.CDLL("libcuda.so.1")
    ctx = ctypes.c_void_p()
    status = _libcuda.cuCtxGetCurrent(ctypes.byref(ctx))
    if status == 3:  # CUDA_ERROR_NOT_INITIALIZED: no context anywhere yet
        return 0
    assert status == 0, f"cuCtxGetCurrent: {status}"
    return ctx.value or 0


# ---- producer ----------------------------------------------------------------------
class Batches:
    """Re-iterable: one epoch of (images int32 [L, K], labels int64 [L]) per iter()."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.epoch = -1
        self.ints = args.sample_bytes // 4

    def __len__(self) -> int:
        return -(-self.args.samples // self.args.loader_batch)

    def empty(self, n: int) -> torch.Tensor:
        if self.args.memory == "pageable":
            return torch.empty(n, self.ints, dtype=torch.int32)
        if SIMULATED:
            return bc._C._testing.pinned_empty(n * self.ints * 4).view(torch.int32).view(n, self.ints)
        return torch.empty(n, self.ints, dtype=torch.int32, pin_memory=True)

    def __iter__(self):
        self.epoch += 1
        a = self.args
        for index, start in enumerate(range(0, a.samples, a.loader_batch)):
            if (self.epoch, index) == a.pause_before:
                touch(a.pause_until + ".paused")  # every earlier batch is published
                wait_for_file(a.pause_until, 60)
            ids = torch.arange(start, min(start + a.loader_batch, a.samples))
            images = self.empty(len(ids))
            images.copy_((ids + self.epoch * a.samples).to(torch.int32).view(-1, 1).expand(-1, self.ints))
            yield images, ids
            del images  # the loader lets go: a pinned block may be handed out again


class WorkerSamples(torch.utils.data.Dataset):
    """For --memory workers: item g is sample g % samples of epoch g // samples,
    so a DataLoader's workers make the same values as Batches."""

    def __init__(self, args: argparse.Namespace):
        self.samples, self.ints = args.samples, args.sample_bytes // 4

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, g: int):
        return torch.full((self.ints,), g, dtype=torch.int32), g % self.samples


class EpochBatches:
    """A batch sampler of global items: epoch e's batches of loader_batch."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.epoch = -1

    def __len__(self) -> int:
        return -(-self.args.samples // self.args.loader_batch)

    def __iter__(self):
        self.epoch += 1
        a = self.args
        first = self.epoch * a.samples
        for start in range(0, a.samples, a.loader_batch):
            yield list(range(first + start, first + min(start + a.loader_batch, a.samples)))


def loader(args: argparse.Namespace):
    """The batches: built here, or (--memory workers) by a DataLoader's
    workers, which write them into the GPU ring's pinned host mirror."""
    if args.memory != "workers":
        return Batches(args)
    return torch.utils.data.DataLoader(WorkerSamples(args), batch_sampler=EpochBatches(args), num_workers=2,
                                       persistent_workers=args.persistent_workers)


def produce(args: argparse.Namespace) -> None:
    before = current_context()
    producer = bc.Producer(loader(args), args.name, device=args.device, epochs=args.epochs,
                           min_consumers=args.min_consumers, slots=args.slots, linger=args.linger,
                           catch_up_window=args.catch_up_window)
    try:
        producer.run()
    finally:
        stats = producer.stats()
        stats["context_before"], stats["context_after"] = before, current_context()
        print(json.dumps(stats), flush=True)


def same_process(args: argparse.Namespace) -> None:
    """A consumer in the producer's own process: CUDA IPC cannot open there."""
    result = {"error": None}
    with bc.Producer(Batches(args), args.name, device="cuda:0", epochs=None):
        try:
            with bc.Consumer(args.name, timeout=args.timeout) as consumer:
                next(iter(consumer))  # the ring is made for the first batch, then mapped
        except Exception as exc:
            result["error"] = f"{type(exc).__name__}: {exc}"
            result["is_cuda_error"] = isinstance(exc, bc.CudaError)
    with open(args.out, "w") as f:
        json.dump(result, f)


# ---- small and odd tensors ----------------------------------------------------------
def odd_batch(ids: torch.Tensor, epoch: int) -> dict:
    """Leaves of odd sizes and dtypes (3 bytes a sample, one element, bools,
    a 0-d tensor, complex), each value made from the sample and the epoch."""
    k = ids + 1000 * epoch
    return {
        "u8": torch.stack([(k * 7 + j) % 251 for j in range(3)], 1).to(torch.uint8),
        "i16": (k * -3).to(torch.int16).view(-1, 1),
        "one": k.view(-1, 1),  # one int64 per sample: a label
        "f64": k.double() / 7,
        "b": torch.stack([(k >> j) % 2 == 1 for j in range(5)], 1),
        "c64": torch.complex(k.float(), -k.float()).view(-1, 1),
        "epoch": torch.tensor(epoch),  # 0-d: travels with the announcement
        "id": ids,
    }


class OddBatches:
    def __init__(self, args: argparse.Namespace):
        self.args, self.epoch = args, -1

    def __len__(self) -> int:
        return -(-self.args.samples // self.args.loader_batch)

    def __iter__(self):
        self.epoch += 1
        for start in range(0, self.args.samples, self.args.loader_batch):
            yield odd_batch(torch.arange(start, min(start + self.args.loader_batch, self.args.samples)),
                            self.epoch)


def produce_odd(args: argparse.Namespace) -> None:
    producer = bc.Producer(OddBatches(args), args.name, device="cuda:0", epochs=args.epochs,
                           min_consumers=args.min_consumers, slots=args.slots)
    producer.run()
    print(json.dumps(producer.stats()), flush=True)


def consume_odd(args: argparse.Namespace) -> None:
    result = {"error": None, "batches": 0, "mismatches": [], "samples": 0}
    try:
        with bc.Consumer(
            args.name,
            batch_size=args.batch_size,
            timeout=args.timeout,
            device=bc.Placement(shared_gpu_views=args.views == "shared"),
        ) as c:
            for _ in range(args.epochs):
                for batch in c:
                    epoch = int(batch["epoch"])
                    want = odd_batch(batch["id"].cpu(), epoch)
                    for key, value in want.items():
                        got = batch[key].cpu()
                        # Byte for byte: the same dtype, shape and bytes.
                        if got.dtype != value.dtype or got.shape != value.shape or \
                                got.reshape(-1).view(torch.uint8).tolist() != value.reshape(-1).view(torch.uint8).tolist():
                            result["mismatches"].append(f"{key} of samples {batch['id'].tolist()}")
                    result["batches"] += 1
                    result["samples"] += len(batch["id"])
            result["stats"] = c.stats()
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    with open(args.out, "w") as f:
        json.dump(result, f)


def consume_two(args: argparse.Namespace) -> None:
    """Two consumers of one GPU ring in one process, each in a thread of its own."""
    results = [None, None]

    def run(k: int, batch_size: int) -> None:
        r = {"error": None, "samples": 0, "mismatches": 0}
        try:
            with bc.Consumer(args.name, batch_size=batch_size, timeout=args.timeout) as c:
                for _ in range(args.epochs):
                    batches = iter(c)
                    e = c.stats()["epoch"]
                    position = 0
                    for images, labels in batches:
                        ids = range(position, position + images.shape[0])
                        want = torch.arange(ids.start, ids.stop) + e * args.samples
                        ok = torch.equal(images.cpu(), want.to(torch.int32).view(-1, 1).expand_as(images.cpu()))
                        ok = ok and torch.equal(labels.cpu(), torch.arange(ids.start, ids.stop))
                        r["mismatches"] += int(not ok)
                        position += len(ids)
                    r["samples"] += position
                r["stats"] = c.stats()
        except Exception as exc:
            r["error"] = f"{type(exc).__name__}: {exc}"
        results[k] = r

    threads = [threading.Thread(target=run, args=(k, b)) for k, b in enumerate(args.batch_sizes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(args.out, "w") as f:
        json.dump(results, f)


def noisy(sample, generator):
    """A trainer's transform: each sample plus noise from its own generator
    (drawn on the CPU, added where the sample is)."""
    image, label = sample
    return image.float() + torch.rand(image.shape, generator=generator).to(image.device), label


def consume_transformed(args: argparse.Namespace) -> None:
    """A consumer whose transform runs on threads, a batch ahead, over the GPU
    ring's batches: every sample once per epoch, with its values, and the
    noise its generator (seed 5, the epoch, the sample's identity) draws."""
    from batchcast._transform import sample_seed

    result = {"error": None, "samples": 0, "mismatches": [], "identity": None}
    try:
        with bc.Consumer(
            args.name,
            batch_size=args.batch_size,
            timeout=args.timeout,
            transform=bc.Augment(noisy, seed=5, threads=2),
        ) as c:
            for number in range(args.epochs):
                seen = []
                e = None
                for (images, labels), indices in c.with_indices():
                    e = c.stats()["epoch"] if e is None else e
                    images, labels = images.cpu(), labels.cpu()
                    # Identity: its position in the producer's epoch (batches
                    # the producer builds), or the DataLoader's dataset index
                    # (WorkerSamples: item g is sample g % samples of epoch g // samples).
                    by_index = c.stats()["sample_identity"] == "dataset index"
                    for row, label, index in zip(images, labels.tolist(), indices.tolist()):
                        identity = label + e * args.samples if by_index else label
                        g = torch.Generator()
                        g.manual_seed(sample_seed(5, number, index))
                        want = (torch.full(row.shape, label + e * args.samples, dtype=torch.int32).float()
                                + torch.rand(row.shape, generator=g))
                        if index != identity or not torch.equal(row, want):
                            result["mismatches"].append(f"epoch {number} sample {label} (identity {index})")
                    seen += labels.tolist()
                if sorted(seen) != list(range(args.samples)):
                    result["mismatches"].append(f"epoch {number}: not every sample once")
                result["samples"] += len(seen)
            result["identity"] = c.stats()["sample_identity"]
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    with open(args.out, "w") as f:
        json.dump(result, f)


# ---- consumer ----------------------------------------------------------------------
def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def gpu_bytes() -> int:
    """GPU memory torch has allocated in this process (0 on the simulated device)."""
    return 0 if SIMULATED else int(torch.cuda.memory_allocated())


class Checker:
    """Compares batches with what they must hold, in stream order, counting
    mismatches without waiting for them on the host (except --check host)."""

    def __init__(self, how: str, delay_us: int):
        self.how = how
        self.host_mismatches = 0
        self.checks = 0
        self.stream = None
        if SIMULATED and how in ("stream", "side"):
            self.stream = bc._C._testing.Stream(delay_us)
        self.cycles = int(delay_us * 1e-6 * 1.5e9)  # ~delay_us at 1.5 GHz
        self.bad = self.side = None  # GPU: made at the first check (none: torch never touches the GPU)

    def __enter__(self):
        # The consumer's current stream while it iterates (simulated: this one).
        if SIMULATED and self.how == "stream":
            self.stream.__enter__()
        return self

    def __exit__(self, *exc):
        if SIMULATED and self.how == "stream":
            self.stream.__exit__(None, None, None)

    def expected(self, ids: range, epoch: int, samples: int, ints: int, device):
        values = torch.arange(ids.start, ids.stop, device=device) + epoch * samples
        return values.to(torch.int32).view(-1, 1).expand(-1, ints)

    def check(self, images: torch.Tensor, labels: torch.Tensor, ids: range, epoch: int, samples: int):
        self.checks += 1
        if self.how == "none":
            return
        if not SIMULATED and self.bad is None:
            self.bad = torch.zeros((), dtype=torch.int64, device=images.device)
            self.side = torch.cuda.Stream(images.device) if self.how == "side" else None
        want = self.expected(ids, epoch, samples, images.shape[1], images.device)
        want_labels = torch.arange(ids.start, ids.stop, device=labels.device)
        if self.how == "host" or (SIMULATED and self.how not in ("stream", "side")):
            ok = torch.equal(images.cpu(), want.cpu()) and torch.equal(labels.cpu(), want_labels.cpu())
            self.host_mismatches += int(not ok)
        elif SIMULATED:
            self.stream.check(images, want.contiguous())
            self.stream.check(labels, want_labels)
        else:
            stream = self.side or torch.cuda.current_stream()
            if self.side is not None:
                self.side.wait_stream(torch.cuda.current_stream())  # the batch is ready there
            with torch.cuda.stream(stream):
                if self.cycles:
                    torch.cuda._sleep(self.cycles)  # this stream falls behind the host
                self.bad += (images != want).sum() + (labels != want_labels).sum()

    def mismatches(self) -> int:
        if SIMULATED:
            if self.stream is None:
                return self.host_mismatches
            self.stream.synchronize()
            return self.stream.mismatches + self.host_mismatches
        if self.bad is None:
            return self.host_mismatches
        torch.cuda.synchronize()
        return int(self.bad.item()) + self.host_mismatches


def consume(args: argparse.Namespace) -> None:
    result = {"error": None, "epochs": [], "contexts": [], "pid": os.getpid()}
    context_before = current_context()
    result["context_before"] = context_before

    def context_check(where: str) -> None:
        now = current_context()
        if now != context_before:
            result["contexts"].append(f"{where}: {context_before} -> {now}")

    checker = Checker(args.check, args.stream_delay_us)
    try:
        consumer = bc.Consumer(
            args.name,
            batch_size=args.batch_size,
            timeout=args.timeout,
            device=bc.Placement(release_after=args.release_after, shared_gpu_views=args.views == "shared"),
            join=args.late_join,
        )
    except Exception as exc:  # what a user would see: the test asserts on it
        result["error"] = f"{type(exc).__name__}: {exc}"
        with open(args.out, "w") as f:
            json.dump(result, f)
        return
    context_check("Consumer()")
    if args.joined:
        touch(args.joined)
    if args.start_after:
        wait_for_file(args.start_after, args.timeout)
    samples = args.samples
    kept = []
    received = 0
    try:
        with checker:
            for _ in range(args.epochs):
                batches = iter(consumer)  # begins the epoch
                e = consumer.stats()["epoch"]
                got = []
                position = 0
                while True:
                    batch = next(batches, None)
                    context_check("next()")
                    if batch is None:
                        break
                    images, labels = batch
                    ids = range(position, position + images.shape[0])
                    received += 1
                    if args.drop_every and received % args.drop_every == 0:
                        pass  # dropped unread: never looked at, never put on a stream
                    else:
                        checker.check(images, labels, ids, e, samples)
                    if received == args.rss_at:
                        result["rss_at"] = rss_bytes()
                        result["gpu_at"] = gpu_bytes()
                        result["stats_at"] = consumer.stats()
                    if args.write_in_place:  # a Mixup or an in-place normalization
                        images.neg_()
                    got.append(len(ids))
                    position += len(ids)
                    if len(kept) < args.keep:
                        kept.append((batch, ids, e))
                        if len(kept) == args.keep and args.kept:
                            touch(args.kept)
                    del batch, images, labels  # drop at once: its release follows the queued check
                    context_check("drop")
                result["epochs"].append({"epoch": e, "samples": position, "batches": len(got)})
        result["mismatches"] = checker.mismatches()
        result["checks"] = checker.checks
        result["received"] = received
        result["rss_end"] = rss_bytes()
        result["gpu_end"] = gpu_bytes()
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    result["stats"] = consumer.stats()
    if kept:  # what it kept is still its batches' values, whatever happened since
        result["kept_intact"] = all(
            torch.equal(batch[0].cpu(), checker.expected(ids, e, samples, batch[0].shape[1], "cpu"))
            and torch.equal(batch[1].cpu(), torch.arange(ids.start, ids.stop))
            for batch, ids, e in kept)
    if args.hold_until:
        touch(args.holding)
        wait_for_file(args.hold_until, args.timeout)
    if args.fresh_thread:
        # Another thread of the same process joins (and maps the ring) while
        # the producer, which has served everything, waits for this consumer
        # to let go: batchcast leaves that thread as it found it too.
        def second() -> None:
            before = current_context()
            try:
                c = bc.Consumer(args.name, timeout=args.timeout)
                c.close()
            except Exception as exc:
                result["error"] = f"fresh thread: {type(exc).__name__}: {exc}"
            if current_context() != before:
                result["contexts"].append(f"fresh thread: {before} -> {current_context()}")
        t = threading.Thread(target=second)
        t.start()
        t.join()
    kept.clear()
    consumer.close()
    context_check("close()")
    with open(args.out, "w") as f:
        json.dump(result, f)
    if args.done:
        touch(args.done)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["produce", "consume", "consume-two", "same-process", "produce-odd",
                                    "consume-odd", "consume-transformed"])
    p.add_argument("name")
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--device", default="cuda:0", help="producer: the ring's GPU")
    p.add_argument("--sample-bytes", type=int, default=1 << 16)
    p.add_argument("--loader-batch", type=int, default=8)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--memory", choices=["pageable", "pinned", "workers"], default="pageable")
    p.add_argument("--persistent-workers", action="store_true")
    p.add_argument("--min-consumers", type=int, default=1)
    p.add_argument("--linger", type=float, default=30.0)
    p.add_argument("--catch-up-window", type=int, default=None)
    p.add_argument("--pause-before", type=lambda t: tuple(int(x) for x in t.split(":")), default=(-1, -1),
                   help="producer: EPOCH:INDEX: before loading that batch, wait for --pause-until")
    p.add_argument("--pause-until", default="", help="producer: ... and create this file + '.paused'")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--check", choices=["host", "stream", "side", "none"], default="host")
    p.add_argument("--stream-delay-us", type=int, default=0,
                   help="consumer: make its checking stream fall behind by this much per batch")
    p.add_argument("--release-after", choices=["stream", "device"], default="stream")
    p.add_argument("--late-join", choices=["next_epoch", "catch_up"], default="next_epoch")
    p.add_argument("--keep", type=int, default=0, help="consumer: keep the first K batches to the end")
    p.add_argument("--joined", default="", help="consumer: file to create once joined")
    p.add_argument("--batch-sizes", type=int, nargs=2, default=[8, 12], help="consume-two")
    p.add_argument("--holding", default="", help="consumer: file to create while it holds --keep batches")
    p.add_argument("--hold-until", default="", help="consumer: hold kept batches until this file exists")
    p.add_argument("--fresh-thread", action="store_true")
    p.add_argument("--kept", default="", help="consumer: file to create once it keeps --keep batches")
    p.add_argument("--views", choices=["copy", "shared"], default="copy",
                   help="consumer: private copies on the GPU (the default) or shared_gpu_views=True")
    p.add_argument("--write-in-place", action="store_true", help="consumer: negate each batch in place")
    p.add_argument("--start-after", default="", help="consumer: joined, take batches once this file exists")
    p.add_argument("--done", default="", help="consumer: file to create when done")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--drop-every", type=int, default=0, help="consumer: drop every N-th batch unread")
    p.add_argument("--rss-at", type=int, default=0,
                   help="consumer: note its memory (host RSS, GPU allocated) after this many batches")
    p.add_argument("--out", default="")
    args = p.parse_args()
    roles = {"produce": produce, "consume": consume, "consume-two": consume_two, "same-process": same_process,
             "produce-odd": produce_odd, "consume-odd": consume_odd, "consume-transformed": consume_transformed}
    roles[args.role](args)


if __name__ == "__main__":
    sys.exit(main())

"""Transport cost per batch: batchcast vs a torch.multiprocessing queue.

    python benchmarks/transport.py [--sizes-mb 1 16 64] [--batches 40] [--out FILE]

For each batch size it runs a producer process and a consumer process and
reports, per batch (the producer publishes a whole epoch before the consumer
starts reading it, so neither side's time includes waiting for the other):
  publish   producer: flatten + copy into the shared ring + announce (waiting
            for ring space excluded), in the second epoch, when the ring's
            pages have been written once (a producer's steady state)
  first     the same in the first epoch: every page of the ring is new, so
            the kernel zero-fills it on first touch (a producer's first pass)
  receive   consumer: one `next()` of the Consumer, up to the user's tensors
  memcpy    the physical bounds: one copy of the batch into warm memory, and
            into fresh (never touched) memory for the first pass
and beside them a torch.multiprocessing queue passing the same batches
(put: producer side, get: consumer side). Medians with [p10, p90].
Results also go to benchmarks/results/transport.json (--out: elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

MB = 1 << 20
ROWS = 64  # samples per batch


def batch_of(size_mb: int) -> torch.Tensor:
    return torch.rand(ROWS, size_mb * MB // (ROWS * 4))


def summary(xs: list[float]) -> dict:
    xs = sorted(xs)
    q = lambda p: xs[min(len(xs) - 1, int(p * len(xs)))]  # noqa: E731
    return {"median": statistics.median(xs), "p10": q(0.1), "p90": q(0.9), "n": len(xs)}


def memcpy_bound(size_mb: int, repeats: int) -> tuple[dict, dict]:
    """One copy of the batch into warm (already faulted) memory, rotating over
    as many destinations as the ring has slots, as publishing does; and the
    first copy into each of them, when its pages are new."""
    torch.set_num_threads(1)
    src = batch_of(size_mb)
    dsts = [torch.empty_like(src) for _ in range(repeats)]  # not touched yet
    cold = []
    for d in dsts:
        t = time.perf_counter()
        d.copy_(src)  # faults in
        cold.append(time.perf_counter() - t)
    times = []
    for d in dsts:
        t = time.perf_counter()
        d.copy_(src)
        times.append(time.perf_counter() - t)
    return summary(times[1:]), summary(cold[1:])


# ---- batchcast --------------------------------------------------------------
def bc_producer(name: str, published, read, size_mb: int, batches: int, out) -> None:
    torch.set_num_threads(1)
    from batchcast import _C
    from batchcast._structure import flatten

    # Room for every batch of an epoch in flight (the ring holds 2 * slots + 1
    # batches, its first slots + 1 written first).
    core = _C.Producer(name=name, slots=batches // 2 + 1, samples_per_epoch=batches * ROWS)
    src = batch_of(size_mb)
    core.wait_for_consumers(1)
    for epoch, key in enumerate(("first", "publish")):
        core.begin_epoch(epoch)
        times = []
        for _ in range(batches):
            t = time.perf_counter()
            leaves, layout, samples = flatten((src,))
            waited = core.publish(leaves, layout, samples)
            times.append(time.perf_counter() - t - waited)
        core.end_epoch()
        published[epoch].set()
        out.put((key, times[1:]))  # the very first also creates the ring
        if epoch == 0:
            read.wait(300)  # the consumer has read (and let go of) the first epoch
    core.finish()
    del core


def bc_consumer(name: str, published, read, out) -> None:
    torch.set_num_threads(1)
    import batchcast as bc

    consumer = bc.Consumer(name, batch_size=ROWS)
    for epoch, key in enumerate(("receive_first", "receive")):
        published[epoch].wait(300)
        times, checksum = [], 0.0
        it = iter(consumer)
        while True:
            t = time.perf_counter()
            try:
                (x,) = next(it)
            except StopIteration:
                break
            times.append(time.perf_counter() - t)
            checksum += float(x[0, 0])  # touch it, as training would
            del x
        out.put((key, times))
        read.set()
    out.put(("stats", consumer.stats()))
    consumer.close()


# ---- torch.multiprocessing queue -------------------------------------------
def mp_producer(queue, done, published, size_mb: int, batches: int, out) -> None:
    torch.set_num_threads(1)
    src = batch_of(size_mb)
    times = []
    for _ in range(batches):
        fresh = src.clone()  # a loader yields a new tensor each batch
        t = time.perf_counter()
        queue.put(fresh)
        times.append(time.perf_counter() - t)
        del fresh
    queue.put(None)
    published.set()
    out.put(("put", times[1:]))
    done.wait(300)  # the consumer fetches shared storages from this process


def mp_consumer(queue, done, published, out) -> None:
    torch.set_num_threads(1)
    published.wait(300)
    times = []
    while True:
        t = time.perf_counter()
        x = queue.get()
        if x is None:
            break
        times.append(time.perf_counter() - t)
        float(x[0, 0])
        del x
    out.put(("get", times))
    done.set()


def run_pair(ctx, targets) -> dict:
    out = ctx.Queue()
    procs = [ctx.Process(target=f, args=(*a, out)) for f, a in targets]
    for p in procs:
        p.start()
    results = {}
    expected = {bc_producer: 2, bc_consumer: 3}
    while len(results) < sum(expected.get(f, 1) for f, _ in targets):
        key, value = out.get(timeout=300)
        results[key] = value
    for p in procs:
        p.join(60)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description="batchcast transport benchmark")
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "transport.json"))
    args = parser.parse_args()
    os.environ.setdefault("BATCHCAST_RUNTIME_DIR", tempfile.mkdtemp(prefix="batchcast-bench-"))
    ctx = mp.get_context("spawn")
    rows = []
    for size in args.sizes_mb:
        n = max(12, args.batches if size <= 16 else args.batches // 2)  # ring holds all n
        name = f"bench-{os.getpid()}-{size}"
        published, read = (ctx.Event(), ctx.Event()), ctx.Event()
        r = run_pair(ctx, [(bc_producer, (name, published, read, size, n)),
                           (bc_consumer, (name, published, read))])
        q, done, ev = ctx.Queue(), ctx.Event(), ctx.Event()
        m = run_pair(ctx, [(mp_producer, (q, done, ev, size, n)), (mp_consumer, (q, done, ev))])
        warm, fresh = memcpy_bound(size, n)
        rows.append({
            "size_mb": size,
            "publish": summary(r["publish"]),
            "publish_first": summary(r["first"]),
            "receive": summary(r["receive"]),
            "receive_first": summary(r["receive_first"]),
            "memcpy": warm,
            "memcpy_fresh": fresh,
            "mp_put": summary(m["put"]),
            "mp_get": summary(m["get"]),
            "views": r["stats"]["views"],
            "copies": r["stats"]["copies"],
        })

    def fmt(s: dict, unit: float = 1e3) -> str:
        return f"{s['median'] * unit:7.3f} [{s['p10'] * unit:.3f}, {s['p90'] * unit:.3f}]"

    print(f"batchcast transport, {ROWS} samples per batch, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, {platform.machine()}; times in ms, median [p10, p90]\n")
    head = (f"{'batch':>6} | {'bc publish':>24} | {'memcpy bound':>24} | {'ratio':>5} | "
            f"{'bc publish, first pass':>24} | {'memcpy, fresh pages':>24} | {'ratio':>5} | "
            f"{'bc receive (us)':>24} | {'mp.Queue put':>24} | {'mp.Queue get':>24}")
    print(head)
    print("-" * len(head))
    for row in rows:
        ratio = row["publish"]["median"] / row["memcpy"]["median"]
        first = row["publish_first"]["median"] / row["memcpy_fresh"]["median"]
        print(f"{row['size_mb']:>4}MB | {fmt(row['publish'])} | {fmt(row['memcpy'])} | {ratio:>5.2f} | "
              f"{fmt(row['publish_first'])} | {fmt(row['memcpy_fresh'])} | {first:>5.2f} | "
              f"{fmt(row['receive'], 1e6)} | {fmt(row['mp_put'])} | {fmt(row['mp_get'])}")
    print("\nconsumer tensors: views of shared memory / copies:",
          ", ".join(f"{r['size_mb']}MB {r['views']}/{r['copies']}" for r in rows))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(
        {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

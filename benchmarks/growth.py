"""What the ring's room for batches up to 4x the first costs: its size, the
memory a producer touches (RSS), and the producer's time per batch when
batches stay the size of the first and when they grow into the room beyond
it (the first pass through new pages faults them in; later passes are warm).

    python benchmarks/growth.py              # first batch of 4 MiB, slots=8
    python benchmarks/growth.py --mib 16

No consumer is present: every slot is free again as soon as it is
announced, so the time is the producer's own (its one copy into the ring).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run(mib: float, slots: int, pattern: str, batches: int) -> dict:
    import torch

    from batchcast import _C
    from batchcast._structure import flatten

    torch.set_num_threads(1)
    rows = int(mib * (1 << 20)) // 4 // 1024
    first = torch.ones(rows, 1024, dtype=torch.int32)
    scales = {"same size": [1.0] * batches,
              "growing to 4x": [1.0 + 3.0 * k / (batches - 1) for k in range(batches)],
              "4x after the first": [1.0] + [4.0] * (batches - 1)}[pattern]
    made = [first] + [torch.ones(int(rows * s), 1024, dtype=torch.int32) for s in scales[1:]]
    before = rss_bytes()
    core = _C.Producer(name=f"growth-{os.getpid()}-{time.monotonic_ns()}", slots=slots,
                       runtime_dir=tempfile.mkdtemp(prefix="bc-growth-"))
    core.begin_epoch(0)
    times = []
    for passes in range(3):
        for batch in made:
            leaves, layout, samples = flatten((batch,))
            t = time.perf_counter()
            core.publish(leaves, layout, samples)
            times.append((passes, (time.perf_counter() - t) * 1e3, batch.nbytes))
    stats = core.stats()
    after = rss_bytes()
    core.close()
    first_pass = [ms for p, ms, _ in times if p == 0]
    warm = [ms for p, ms, _ in times if p == 2]
    gbps = [b / (ms * 1e-3) / 1e9 for p, ms, b in times if p == 2]
    return {"pattern": pattern, "ring_bytes": stats["ring_bytes"], "rss_growth": after - before,
            "first_pass_ms": statistics.median(first_pass), "first_pass_max_ms": max(first_pass),
            "warm_ms": statistics.median(warm), "warm_gbps": statistics.median(gbps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=float, default=4.0, help="bytes of the first batch")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--batches", type=int, default=40, help="per pass (3 passes)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    results = [run(args.mib, args.slots, p, args.batches)
               for p in ("same size", "growing to 4x", "4x after the first")]
    mib = 1 << 20
    print(f"First batch {args.mib:g} MiB, slots={args.slots}; ring: {results[0]['ring_bytes'] / mib:.0f} MiB "
          f"of address space ({(2 * args.slots + 1)} x 4 x the first batch; without the room for "
          f"growth it would be {(2 * args.slots + 1) * args.mib:.0f} MiB)")
    head = ("batches", "producer RSS grew", "publish, 1st pass (median/max)", "publish, 3rd pass", "GB/s, 3rd pass")
    print(" | ".join(f"{h:>30}" for h in head))
    for r in results:
        cells = (r["pattern"], f"{r['rss_growth'] / mib:.0f} MiB",
                 f"{r['first_pass_ms']:.2f} / {r['first_pass_max_ms']:.2f} ms", f"{r['warm_ms']:.2f} ms",
                 f"{r['warm_gbps']:.1f}")
        print(" | ".join(f"{c:>30}" for c in cells))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"mib": args.mib, "slots": args.slots, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()

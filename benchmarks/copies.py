"""What a private copy of each batch costs a trainer, beside a zero-copy view:
`Consumer(..., device=bc.Placement(writable=True))` on a host ring, and a GPU ring's default
private copy against `shared_gpu_views=True` (here on the simulated device,
whose memory is host memory: a memcpy stands for the device-to-device copy;
on a GPU, `benchmarks/gpu.py` measures it). The bound beside them: one
memcpy of the batch in a plain process.

    python benchmarks/copies.py                 # 1, 16 and 64 MiB batches
    python benchmarks/copies.py --mib 4 --repeats 5

Each cell: the trainer's wall time per next() with the batch already in the
ring and announced, median [p10, p90] over the batches of all repeats, in
the third epoch (the trainer has read the ring's pages before, as in
training).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
BATCHES = 24  # per epoch: the ring holds them all (slots), announced before timing
WARM = 2      # untimed epochs first: the trainer has touched the ring's pages, as in training


def role_serve(args) -> None:
    import torch

    import batchcast as bc

    batch = torch.arange(args.bytes // 4, dtype=torch.int32).view(8, -1)
    producer = bc.Producer([(batch,)] * BATCHES, args.name, device=args.device, epochs=WARM + 1,
                           slots=BATCHES + 2)
    producer.run()


def role_take(args) -> None:
    import batchcast as bc

    consumer = bc.Consumer(
        args.name,
        timeout=60,
        device=bc.Placement(writable=args.how == "copy" and args.device == "cpu",
                            shared_gpu_views=args.how == "view" and args.device != "cpu"),
    )
    for _ in range(WARM):
        for batch in consumer:
            del batch
    deadline = time.monotonic() + 60
    while consumer.stats()["loader_batches"] < (WARM + 1) * BATCHES and time.monotonic() < deadline:
        time.sleep(0.01)
    times = []
    it = iter(consumer)
    for _ in range(BATCHES):
        t = time.perf_counter()
        batch = next(it)
        times.append(time.perf_counter() - t)
        del batch
    for _ in it:
        pass
    stats = consumer.stats()
    consumer.close()
    print(json.dumps({"us": [x * 1e6 for x in times], "batch_copies": stats["batch_copies"],
                      "transfer": stats["transfer"]}), flush=True)


def run(args, device: str, how: str, nbytes: int) -> dict:
    env = dict(os.environ)
    if device != "cpu":
        env["BATCHCAST_SIMULATED_CUDA"] = "seed=1,max_delay_us=0"
    name = "copies-" + uuid.uuid4().hex[:8]
    common = [sys.executable, __file__, "--name", name, "--device", device, "--bytes", str(nbytes),
              "--runtime-dir", args.runtime_dir]
    env["BATCHCAST_RUNTIME_DIR"] = args.runtime_dir
    serve = subprocess.Popen(common + ["--role", "serve"], env=env)
    take = subprocess.run(common + ["--role", "take", "--how", how], env=env, capture_output=True,
                          text=True, timeout=300)
    serve.wait(120)
    if take.returncode != 0:
        raise RuntimeError(take.stderr[-2000:])
    return json.loads(take.stdout.strip().splitlines()[-1])


def memcpy_us(nbytes: int) -> list[float]:
    """One thread copying each of BATCHES distinct batches (as a ring holds
    them, so that none is in a cache from the copy before) into warm memory."""
    import torch

    torch.set_num_threads(1)
    sources = [torch.arange(nbytes // 4, dtype=torch.int32) + k for k in range(BATCHES)]
    targets = [torch.empty_like(sources[0]) for _ in range(4)]
    for k, src in enumerate(sources):
        targets[k % 4].copy_(src)
    out = []
    for k, src in enumerate(sources):
        t = time.perf_counter()
        targets[k % 4].copy_(src)
        out.append((time.perf_counter() - t) * 1e6)
    return out


def cell(values: list[float]) -> str:
    v = sorted(values)
    q = lambda p: v[min(len(v) - 1, int(p * len(v)))]  # noqa: E731
    return f"{statistics.median(v):9.1f} [{q(0.1):.1f}, {q(0.9):.1f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", default="driver")
    ap.add_argument("--mib", type=float, nargs="+", default=[1, 16, 64])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="")
    ap.add_argument("--name", default="")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--bytes", type=int, default=0)
    ap.add_argument("--how", default="view")
    ap.add_argument("--runtime-dir", default="")
    args = ap.parse_args()
    if args.role == "serve":
        return role_serve(args)
    if args.role == "take":
        return role_take(args)
    args.runtime_dir = tempfile.mkdtemp(prefix="bc-copies-")
    rows = {}
    columns = [("cpu", "view"), ("cpu", "copy"), ("cuda:0", "view"), ("cuda:0", "copy")]
    for mib in args.mib:
        nbytes = int(mib * (1 << 20)) // 32 * 32
        row = {"memcpy": memcpy_us(nbytes)}
        for device, how in columns:
            times, copies = [], 0
            for _ in range(args.repeats):
                r = run(args, device, how, nbytes)
                times += r["us"]
                copies += r["batch_copies"]
            row[f"{device}/{how}"] = times
            row[f"{device}/{how}/batch_copies"] = copies
        rows[mib] = row
        print(f"{mib:g} MiB done", file=sys.stderr, flush=True)
    print(f"Trainer wall time per next() (µs), batch already announced; median [p10, p90] of "
          f"{BATCHES} x {args.repeats}")
    head = ["batch", "memcpy (bound)", "host view", "host writable=True", "sim. GPU shared view",
            "sim. GPU copy (default)"]
    print(" | ".join(f"{h:>24}" for h in head))
    for mib, row in rows.items():
        cells = [f"{mib:g} MiB", cell(row["memcpy"])] + [cell(row[f"{d}/{h}"]) for d, h in columns]
        print(" | ".join(f"{c:>24}" for c in cells))
    for mib, row in rows.items():
        for d, h in columns:
            want = (WARM + 1) * BATCHES * args.repeats if h == "copy" else 0
            assert row[f"{d}/{h}/batch_copies"] == want, (mib, d, h, row[f"{d}/{h}/batch_copies"])
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"batches_per_run": BATCHES, "repeats": args.repeats, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

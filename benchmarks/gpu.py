"""Training throughput with N consumers on one GPU: one shared batchcast
pipeline vs each trainer with its own DataLoader vs data already on the GPU.

    python benchmarks/gpu.py [--consumers 1 2 4] [--steps 60] [--loader-cpus 2]

Every trainer is a separate process training a small ResNet-style model on
64x64 images (batch 64). The loader is CPU-bound (the SyntheticImages
pipeline) and all loading -- the producer's workers, or every trainer's own
workers -- runs on the same `--loader-cpus` cores, as on a box whose CPUs can
feed one model: that is the bottleneck batchcast removes. Columns:

  shared     one Producer(device=cuda:0) + N Consumers (zero-copy views)
  own        each trainer with its own DataLoader (+ pin_memory, .cuda())
  resident   batches already on the GPU: the upper bound (no loading at all)

Trainers start together (a barrier after set-up) and aggregate samples/s is
the samples of every trainer's timed steps over the span from the first start
to the last end; medians over --repeats runs with [min, max]. The timed steps
follow a warm-up longer than the ring, so a pre-filled ring does not flatter
sharing. Also: per-batch consumer overhead (one Consumer.__next__ with the
batch already announced: stream wait + views + structure), and GPU memory for
data (the ring, allocated once, vs one batch per trainer). Results go to
benchmarks/results/gpu.json. `--device cpu` runs the same thing without a GPU
(a smoke test of the script; the numbers mean nothing).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch
import torch.nn as nn

HERE = Path(__file__).resolve().parent
BATCH = 64
SIZE = 64


# ---- the model --------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.skip(x))


def small_resnet(classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        Block(32, 32, 1), Block(32, 64, 2), Block(64, 128, 2), Block(128, 128, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, classes))


# ---- roles (each a process) ----------------------------------------------
def pin_to(cpus: list[int]):
    def init(_worker_id: int = 0) -> None:
        os.sched_setaffinity(0, cpus)
    return init


def make_loader(args, length: int):
    from torch.utils.data import DataLoader

    from batchcast.synthetic import SyntheticImages

    return DataLoader(SyntheticImages(length, SIZE), batch_size=BATCH, num_workers=args.workers,
                      worker_init_fn=pin_to(args.loader_cpu_list), persistent_workers=False,
                      pin_memory=args.device != "cpu" and args.mode == "own")


def role_serve(args) -> None:
    import batchcast as bc

    os.sched_setaffinity(0, args.loader_cpu_list)  # flattening and staging count as loading
    loader = make_loader(args, args.samples)
    producer = bc.Producer(loader, args.name, device=args.device, epochs=1,
                           min_consumers=args.consumers[0], slots=args.slots)
    producer.run()
    print(json.dumps({"producer": producer.stats()}), flush=True)


def role_train(args) -> None:
    os.sched_setaffinity(0, args.trainer_cpu_list)
    torch.set_num_threads(1)
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = small_resnet().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if args.mode in ("shared", "views"):
        import batchcast as bc

        # "shared": private copies on the GPU (the default); "views": zero-copy views.
        batches = bc.Consumer(
            args.name,
            batch_size=BATCH,
            timeout=120,
            device=bc.Placement(shared_gpu_views=args.mode == "views"),
        )
    elif args.mode == "own":
        batches = make_loader(args, args.samples)
    else:  # resident: a few distinct batches, generated on the device up front; timed longer
        from batchcast.synthetic import SyntheticImages

        ds = SyntheticImages(8 * BATCH, SIZE)
        resident = []
        for k in range(8):
            samples = [ds[i] for i in range(k * BATCH, (k + 1) * BATCH)]
            resident.append((torch.stack([s[0] for s in samples]).to(device),
                             torch.tensor([s[1] for s in samples]).to(device)))
        batches = [resident[i % 8] for i in range(args.samples // BATCH * 5)]

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    # Start together: tell the driver we are set up, wait for its go.
    Path(args.barrier, f"{os.getpid()}.ready").touch()
    while not Path(args.barrier, "go").exists():
        time.sleep(0.005)
    step, t0, next_s, data_bytes = 0, None, [], 0
    iterator = iter(batches)
    while True:
        t = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            break
        next_s.append(time.perf_counter() - t)
        images, labels = batch[0], batch[1]
        if args.mode == "own" and device.type == "cuda":
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
        data_bytes = max(data_bytes, images.numel() * images.element_size())
        loss = nn.functional.cross_entropy(model(images), labels.long())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step == args.warmup:
            sync()
            t0 = time.perf_counter()
    sync()
    t1 = time.perf_counter()
    seconds = t1 - t0 if t0 else float("nan")
    # perf_counter is CLOCK_MONOTONIC: comparable across processes on Linux.
    out = {"samples": (step - args.warmup) * BATCH, "seconds": seconds, "t0": t0, "t1": t1,
           "next_median_us": statistics.median(next_s[args.warmup:]) * 1e6 if len(next_s) > args.warmup else None,
           "data_bytes_per_batch": data_bytes}
    if args.mode in ("shared", "views"):
        out["consumer"] = batches.stats()
        batches.close()
    print(json.dumps(out), flush=True)


def role_overhead(args) -> None:
    """Consumer.__next__ with every batch already in the ring and announced."""
    import batchcast as bc

    consumer = bc.Consumer(
        args.name,
        batch_size=BATCH,
        timeout=60,
        device=bc.Placement(shared_gpu_views=args.mode == "views"),
    )
    deadline = time.monotonic() + 60  # the producer fills the ring, then waits (lockstep)
    while consumer.stats()["loader_batches"] < args.slots - 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    times = []
    it = iter(consumer)
    for _ in range(args.slots - 2):
        t = time.perf_counter()
        batch = next(it)
        times.append(time.perf_counter() - t)
        del batch
    for _ in it:
        pass
    consumer.close()
    times.sort()
    print(json.dumps({"overhead_us": [x * 1e6 for x in times]}), flush=True)


def role_serve_memory(args) -> None:
    """A producer of pre-made batches (no loading cost), for the overhead run."""
    import batchcast as bc
    from batchcast.synthetic import SyntheticImages

    ds = SyntheticImages(BATCH, SIZE)
    samples = [ds[i] for i in range(BATCH)]
    batch = (torch.stack([s[0] for s in samples]), torch.tensor([s[1] for s in samples]))
    producer = bc.Producer([batch] * (3 * args.slots), args.name, device=args.device, epochs=1,
                           slots=args.slots)
    producer.run()


# ---- the driver ---------------------------------------------------------------
def spawn(args, role: str, **extra) -> subprocess.Popen:
    cmd = [sys.executable, __file__, "--role", role, "--device", args.device, "--barrier", args.barrier,
           "--workers", str(args.workers), "--loader-cpus", args.loader_cpus,
           "--trainer-cpus", args.trainer_cpus, "--slots", str(args.slots),
           "--warmup", str(args.warmup)]
    for k, v in extra.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def last_json(p: subprocess.Popen, timeout: float) -> dict:
    out, _ = p.communicate(timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{p.args[3:5]} exited {p.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def gpu_used() -> int | None:
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info(0)
    return total - free


def run_once(args, mode: str, n: int) -> dict:
    name = "bench-" + uuid.uuid4().hex[:8]
    samples = (args.steps + args.warmup) * BATCH
    base = gpu_used()
    args.barrier = tempfile.mkdtemp(prefix="bc-barrier-")
    server = (spawn(args, "serve", name=name, consumers=n, samples=samples)
              if mode in ("shared", "views") else None)
    trainers = [spawn(args, "train", name=name, mode=mode, samples=samples) for _ in range(n)]
    everyone = trainers + ([server] if server else [])
    deadline = time.monotonic() + args.run_timeout
    peak, go = base, False
    try:
        while any(t.poll() is None for t in trainers):
            failed = [p for p in everyone if p.poll() not in (None, 0)]
            if failed:
                raise RuntimeError(f"{failed[0].args[3]} exited {failed[0].returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no result within {args.run_timeout} s")
            if not go and len(list(Path(args.barrier).glob("*.ready"))) == n:
                Path(args.barrier, "go").touch()
                go = True
            used = gpu_used()
            if used is not None:
                peak = max(peak, used)
            time.sleep(0.05 if not go else 0.2)
        results = [last_json(t, 60) for t in trainers]
        producer = last_json(server, 120)["producer"] if server else None
    finally:
        for p in everyone:
            if p.poll() is None:
                p.kill()
                p.wait()
    span = max(r["t1"] for r in results) - min(r["t0"] for r in results)
    rate = sum(r["samples"] for r in results) / span
    data = producer["ring_bytes"] if producer else (
        0 if mode == "resident" else sum(r["data_bytes_per_batch"] for r in results))
    return {"aggregate": rate, "per_trainer": [r["samples"] / r["seconds"] for r in results],
            "next_median_us": [r["next_median_us"] for r in results],
            "gpu_used_peak_bytes": None if base is None else peak - base,
            "data_gpu_bytes": data,
            "consumers": [r.get("consumer") for r in results]}


def overhead(args, mode: str = "shared") -> list[float]:
    name = "bench-" + uuid.uuid4().hex[:8]
    server = spawn(args, "serve_memory", name=name, slots=args.overhead_slots)
    consumer = spawn(args, "overhead", name=name, slots=args.overhead_slots, mode=mode)
    try:
        return last_json(consumer, 180)["overhead_us"]
    finally:
        for p in (consumer, server):
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()


def role_producer_cpu(args) -> None:
    """Process CPU per batch of publishing into a GPU ring, from unpinned and
    from pinned loader tensors, and from batches a loader worker wrote into
    the ring's pinned host mirror (in place: here this process writes them,
    outside the timed calls, as a worker would), beside one plain
    .to(device, non_blocking=True). No consumer is present, so every slot is
    free again as soon as it is announced: this is the producer's own cost,
    nothing waits."""
    from batchcast import _C
    from batchcast._structure import flatten

    n, device = 200, torch.device(args.device)
    out = {}
    for variant in ("unpinned", "pinned", "in place", "plain .to()"):
        batches = [(torch.rand(BATCH, 3, SIZE, SIZE), torch.arange(BATCH)) for _ in range(n)]
        if variant in ("pinned", "plain .to()"):
            batches = [(x.pin_memory(), y.pin_memory()) for x, y in batches]
        if variant == "plain .to()":
            start = time.process_time()
            kept = [(x.to(device, non_blocking=True), y.to(device, non_blocking=True)) for x, y in batches]
            torch.cuda.synchronize(device)
            out[variant] = (time.process_time() - start) / n * 1e6
            del kept
            continue
        core = _C.Producer(name=f"cpu-{os.getpid()}-{len(out)}", cuda_device=device.index or 0, slots=8)
        core.begin_epoch(0)
        if variant == "in place":
            leaves, layout, samples = flatten(batches[0])
            core.publish(leaves, layout, samples)  # the ring is allocated by the first
            cpu, mirror = 0.0, None

            def in_mirror(offsets, like):  # views of the mirror where the lease puts `like`
                return [mirror[o:o + t.nbytes].view(t.dtype).view(t.shape) for o, t in zip(offsets, like)]

            for x, y in batches[1:]:
                start = time.process_time()
                seq, _fd, _bytes, offsets, _sizes = core.lease(8)
                cpu += time.process_time() - start
                if mirror is None:
                    mirror = core.host_ring()
                for view, t in zip(in_mirror(offsets, (x, y)), (x, y)):  # the worker's part
                    view.copy_(t)
                start = time.process_time()  # the producer's: its own views of the mirror, then the publish
                views = in_mirror(offsets, (x, y))
                core.publish(views, layout, samples, seq, True)  # written in place
                cpu += time.process_time() - start
                del views
            del mirror
            stats = core.stats()
            assert stats["batches_in_place"] == n - 1, stats  # all but the first
            core.end_epoch()
            core.finish()
            out[variant] = cpu / (n - 1) * 1e6
            core.close()
            continue
        flat = [flatten(b) for b in batches]
        for leaves, layout, samples in flat[:20]:  # the ring is allocated by the first
            core.publish(leaves, layout, samples)
        start = time.process_time()
        for leaves, layout, samples in flat[20:]:
            core.publish(leaves, layout, samples)
        core.end_epoch()
        core.finish()
        out[variant] = (time.process_time() - start) / (n - 20) * 1e6
        core.close()
    print("PRODUCER_CPU " + json.dumps(out), flush=True)


def producer_cpu(args) -> dict:
    cmd = [sys.executable, __file__, "--role", "producer_cpu", "--device", args.device]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout)
    for line in done.stdout.splitlines():
        if line.startswith("PRODUCER_CPU "):
            return json.loads(line.split(" ", 1)[1])
    raise RuntimeError(f"producer CPU run failed: {done.stderr[-2000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", default="driver")
    ap.add_argument("--consumers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--modes", nargs="+", default=["shared", "views", "own", "resident"],
                    help="shared: batchcast (private copies on the GPU, the default); views: "
                         "batchcast with shared_gpu_views=True; own: a DataLoader per trainer; "
                         "resident: data already on the GPU (the bound)")
    ap.add_argument("--steps", type=int, default=60, help="timed training steps per trainer")
    ap.add_argument("--warmup", type=int, default=20, help="untimed steps (more than the ring holds)")
    ap.add_argument("--run-timeout", type=float, default=240, help="seconds one configuration may take")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers per loader")
    ap.add_argument("--loader-cpus", default="", help="cores all loading shares (default: the first two)")
    ap.add_argument("--trainer-cpus", default="", help="cores for trainers (default: the others)")
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--overhead-slots", type=int, default=64, help="ring slots for the overhead run")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--out", default=str(HERE / "results" / "gpu.json"))
    # role-only
    ap.add_argument("--barrier", default="")
    ap.add_argument("--name", default="")
    ap.add_argument("--mode", default="shared")
    ap.add_argument("--samples", type=int, default=0)
    args = ap.parse_args()

    def cpus(text: str) -> list[int]:
        out = []
        for part in filter(None, text.split(",")):
            lo, _, hi = part.partition("-")
            out += list(range(int(lo), int(hi or lo) + 1))
        return out

    every = sorted(os.sched_getaffinity(0))
    if not args.loader_cpus:
        args.loader_cpus = ",".join(map(str, every[:2]))
    args.loader_cpu_list = cpus(args.loader_cpus)
    args.trainer_cpu_list = cpus(args.trainer_cpus) or [c for c in every if c not in args.loader_cpu_list] or every
    if not args.trainer_cpus:
        args.trainer_cpus = ",".join(map(str, args.trainer_cpu_list))
    if args.role != "driver":
        {"serve": role_serve, "train": role_train, "overhead": role_overhead,
         "serve_memory": role_serve_memory, "producer_cpu": role_producer_cpu}[args.role](args)
        return

    if args.device != "cpu" and not torch.cuda.is_available():
        sys.exit("no CUDA GPU visible: run on a GPU machine, or pass --device cpu for a smoke test")
    env = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if args.device != "cpu" else None,
        "cpus": os.cpu_count(),
        "loader_cpus": args.loader_cpus,
        "workers_per_loader": args.workers,
        "batch": BATCH,
        "image": [3, SIZE, SIZE],
        "python": platform.python_version(),
    }
    print(json.dumps(env))
    table: dict = {}
    errors: list[str] = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save(over=None, pcpu=None, over_views=None) -> None:
        out.write_text(json.dumps({"env": env, "table": table, "overhead_us": over,
                                   "overhead_views_us": over_views,
                                   "producer_cpu_us": pcpu, "errors": errors}, indent=1))

    for n in args.consumers:
        for mode in args.modes:
            runs = []
            for _ in range(args.repeats):
                try:
                    runs.append(run_once(args, mode, n))
                except Exception as exc:  # recorded; the other configurations still run
                    errors.append(f"{mode}/{n}: {exc}")
                    print(f"  {mode:8s} N={n}: FAILED {exc}", flush=True)
            if runs:
                rates = [r["aggregate"] for r in runs]
                table[f"{mode}/{n}"] = {"median": statistics.median(rates), "min": min(rates),
                                        "max": max(rates), "runs": runs}
                print(f"  {mode:8s} N={n}: {statistics.median(rates):8.0f} samples/s "
                      f"[{min(rates):.0f}, {max(rates):.0f}]", flush=True)
            save()
    over, over_views = [], []
    try:
        over = overhead(args, "shared")
        over_views = overhead(args, "views")
    except Exception as exc:
        errors.append(f"overhead: {exc}")
    save(over, None, over_views)
    pcpu = None
    if args.device != "cpu":
        try:
            pcpu = producer_cpu(args)
        except Exception as exc:
            errors.append(f"producer cpu: {exc}")
        save(over, pcpu, over_views)

    mib = 1 << 20
    print(f"\nSamples/s, aggregate over N trainers (median [min, max] of {args.repeats}); "
          f"all loading on cores {args.loader_cpus}")
    print(f"{'N':>3} | {'batchcast (copies)':>22} | {'batchcast (views)':>22} | {'own DataLoaders':>22} | "
          f"{'resident (bound)':>22} | {'shared/own':>10} | {'data MiB: ring / batch x N':>26}")
    for n in args.consumers:
        cells = []
        for mode in ("shared", "views", "own", "resident"):
            t = table.get(f"{mode}/{n}")
            cells.append(f"{t['median']:8.0f} [{t['min']:.0f}, {t['max']:.0f}]" if t else "-")
        s, o = table.get(f"shared/{n}"), table.get(f"own/{n}")
        ratio = f"{s['median'] / o['median']:.2f}x" if s and o else "-"
        mem = (f"{s['runs'][0]['data_gpu_bytes'] / mib:.1f} / {o['runs'][0]['data_gpu_bytes'] / mib:.1f}"
               if s and o else "-")
        print(f"{n:>3} | {cells[0]:>22} | {cells[1]:>22} | {cells[2]:>22} | {cells[3]:>22} | {ratio:>10} | "
              f"{mem:>26}")
    for label, times in (("private copies (the default)", over), ("shared_gpu_views=True", over_views)):
        if times:
            q = lambda p: times[min(len(times) - 1, int(p * len(times)))]  # noqa: E731
            print(f"\nConsumer overhead per batch, {label} (next() with the batch already announced, "
                  f"n={len(times)}): median {statistics.median(times):.1f} us [p10 {q(0.1):.1f}, "
                  f"p90 {q(0.9):.1f}]")
    if pcpu:
        print(f"\nProducer CPU per {BATCH}x3x{SIZE}x{SIZE} float32 batch into the GPU ring "
              "(process CPU, no consumer waiting): "
              + ", ".join(f"{k} {v:.0f} us" for k, v in pcpu.items()))
    for e in errors:
        print(f"FAILED: {e}")
    print(f"results: {args.out}")
    if errors:
        sys.exit(1)


if __name__ == "__main__":
    main()

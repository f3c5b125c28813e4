"""Decode once, augment per trial: an augmentation sweep of K trials, each with
its own augmentation strength, on ImageNet-sized JPEGs.

    python benchmarks/augment.py                    # K = 1 2 4, 3 repeats (~10 min on 2 CPUs)
    python benchmarks/augment.py --ks 1 2 4 8       # ... and 8 trials (~17 min)
    python benchmarks/augment.py --quick            # smoke run (< 2 min), into benchmarks/.cache/quick/

Each trial is a process of its own (multiprocessing, spawn) that takes every
sample of one epoch once, as float32 3x224x224 images augmented with its own
parameters: trial k (k = 0 .. K-1) has colour-jitter strength s_k = 0.1 +
0.1 k and seed 1000 + k. The data: --images samples (sample i decodes file
i % --files; photo-like JPEGs of 500x375, quality 90, ~120 KB, generated
once into benchmarks/.cache/). The pieces are in benchmarks/_augment_ops.py:

  decode   PIL decode, shorter side to 256 (bilinear), centre crop 256 ->
           uint8 3x256x256 (D: its CPU per sample)
  augment  per sample, from a torch.Generator of its own: RandomResizedCrop(224)
           (torchvision's algorithm, bilinear interpolate on float, no
           antialias), horizontal flip (p=0.5), colour jitter (brightness,
           contrast, saturation, factors in [1-s, 1+s]), normalise (A: its CPU
           per sample; C: its share of collating a float batch)

Systems, all with the same K, the same samples per trial and batch size:

  dataloader           what users do today: every trial has its own DataLoader
                       that decodes and augments (--workers workers each;
                       default max(1, CPUs // K), so that K trials together
                       have about the CPUs' worth of workers)
  batchcast-shared     batchcast today, for reference: one producer process
                       whose DataLoader decodes and augments once (trial 0's
                       parameters); every trial gets the same augmented batches
  batchcast-per-trial  the producer's DataLoader decodes once (uint8 256x256);
                       each trial's bc.Consumer(name, batch_size=B,
                       transform=bc.Augment(augment, seed=..., threads=T))
                       augments every sample itself with its own parameters
                       (T = --threads; default max(1, CPUs // K)). Skipped,
                       saying so, where bc.Consumer has no transform= yet.
  (the producer's DataLoader has --producer-workers workers, default the CPUs)

Every process is set up (imports, loader built, consumer connected) before a
common start signal; loading starts at it. Measured per run:

  samples/s   samples all trials received / (the last trial's last sample -
              the start): the aggregate over the sweep
  CPU/sample  user + system seconds of every process involved (trials,
              producer, loader workers; psutil) from the start to the last
              trial's last sample, / samples received
  once        every trial got every sample of the epoch exactly once (the
              run fails loudly otherwise)
  augmented   whether trials got different augmentations of a sample (a
              fingerprint of each image compared with trial 0's)

Medians [min, max] over --repeats runs, the systems alternated (A B C A B C).
Beside them the bounds, from D, A and C measured first, alone, one thread,
in a process of its own: K trials cost K (D + A') per sample apart and
D + K A' shared (A' = A + C), so sharing the decode speeds a sweep up at most
K (D + A') / (D + K A'); on P CPUs a DataLoader per trial delivers at most
P / (D + A') samples/s in all, per-trial augmentation on a shared decode
K P / (D + K A'), and one shared augmentation K P / (D + A').

Writes --out (default benchmarks/results/augment.md) and the raw
measurements beside it (augment.json).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import inspect
import json
import logging
import multiprocessing as mp
import os
import platform
import queue
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from torch.utils.data import Sampler

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

SYSTEMS = ["dataloader", "batchcast-shared", "batchcast-per-trial"]
SIZE = 224


def strength_of(trial: int) -> float:
    """Trial k's colour-jitter strength."""
    return round(0.1 + 0.1 * trial, 3)


def seed_of(trial: int) -> int:
    return 1000 + trial


# ---- the loaders -----------------------------------------------------------------------
class GatedSampler(Sampler):
    """A sampler whose first pass waits for the start signal. `arrived` is set
    when the loader first asks it for an index, i.e. after its workers have
    started: a trial's own DataLoader is then as far as the producer's."""

    def __init__(self, sampler, go) -> None:
        self.sampler, self.go = sampler, go
        self.arrived = threading.Event()

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        self.arrived.set()
        if self.go is not None:
            self.go.wait()
            self.go = None
        yield from self.sampler


def _worker_init(_worker_id: int) -> None:
    import torch

    torch.set_num_threads(1)


def make_loader(cfg: dict, dataset, workers: int, seed: int, go):
    """A shuffling DataLoader over `dataset` (its own seeded order), gated by `go`;
    workers forked, as a trial started on its own on Linux has them."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    generator = torch.Generator().manual_seed(seed)
    sampler = GatedSampler(RandomSampler(dataset, generator=generator), go)
    loader = DataLoader(dataset, batch_size=cfg["batch_size"], sampler=sampler,
                        num_workers=workers, worker_init_fn=_worker_init if workers else None,
                        multiprocessing_context="fork" if workers else None,
                        persistent_workers=False)
    return loader, sampler


def datasets(cfg: dict):
    import _augment_ops as ops

    decoded = ops.DecodedImages(cfg["folder"], cfg["images"], files=cfg["files"])
    return ops, decoded


def consumer_options() -> set[str]:
    import batchcast as bc

    return set(inspect.signature(bc.Consumer.__init__).parameters)


def per_trial_missing() -> str | None:
    """Why batchcast-per-trial cannot run with the installed batchcast, or None."""
    try:
        import batchcast as bc

        if "transform" not in consumer_options():
            return (f"not available yet: batchcast.Consumer has no transform= parameter "
                    f"(batchcast {getattr(bc, '__version__', '?')} at "
                    f"{Path(bc.__file__).parent})")
    except ImportError as exc:
        return f"batchcast does not import: {exc}"
    return None


# ---- the processes -----------------------------------------------------------------------
def cpu_seconds(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def trial_main(system: str, index: int, cfg: dict, name: str, ready, go, leave, results) -> None:
    import torch

    torch.set_num_threads(1)
    who = f"trial{index}"
    out: dict[str, Any] = {"who": who, "pid": os.getpid(), "error": None,
                           "strength": strength_of(index), "seed": seed_of(index)}
    consumer = None
    set_up = False
    try:
        ops, decoded = datasets(cfg)
        if system == "dataloader":
            data = ops.AugmentedImages(decoded, strength_of(index), seed_of(index))
            loader, gate = make_loader(cfg, data, cfg["workers"], seed_of(index), go)
            holder: dict[str, Any] = {}

            def start() -> None:  # blocks in the gate (workers started) until the start
                try:
                    holder["it"] = iter(loader)
                except BaseException as exc:  # noqa: BLE001 - raised below
                    holder["error"] = exc
                gate.arrived.set()  # without workers, iter() asks the sampler nothing yet

            starter = threading.Thread(target=start, name="loader-start", daemon=True)
            starter.start()
            gate.arrived.wait()
            if "error" in holder:
                raise holder["error"]
            out["workers"] = cfg["workers"]
        else:
            import batchcast as bc

            options: dict[str, Any] = {"timeout": cfg["timeout"]}
            if system == "batchcast-per-trial":
                augment = ops.make_augment(strength_of(index))
                if hasattr(bc, "Augment"):
                    options["transform"] = bc.Augment(augment, seed=seed_of(index), threads=cfg["threads"])
                    out["consumer_options"] = {"timeout": cfg["timeout"], "transform": "augment",
                                               "seed": seed_of(index), "threads": cfg["threads"]}
                else:  # a batchcast from before its grouped options
                    have = consumer_options()
                    options["transform"] = augment
                    if "seed" in have:
                        options["seed"] = seed_of(index)
                    if "transform_threads" in have:
                        options["transform_threads"] = cfg["threads"]
                    out["consumer_options"] = {k: (v if k != "transform" else "augment")
                                               for k, v in options.items()}
            consumer = bc.Consumer(name, batch_size=cfg["batch_size"], **options)
        ready.put((who, os.getpid()))
        set_up = True
        go.wait()
        if system == "dataloader":
            starter.join()
            if "error" in holder:
                raise holder["error"]
            it = holder["it"]
        else:
            it = iter(consumer)
        out.update(consume(it, cfg))
        del it
    except BaseException as exc:  # noqa: BLE001 - reported: the run is marked failed
        out["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"
    out["cpu_self_s"] = cpu_seconds(resource.RUSAGE_SELF)
    if consumer is not None:
        try:
            out["consumer_stats"] = consumer.stats()
        except Exception as exc:  # noqa: BLE001 - recorded, not fatal
            out["consumer_stats"] = {"error": repr(exc)}
    results.put(out)
    if set_up:  # alive until the driver has read the CPU times
        leave.wait(cfg["run_timeout"])
    if consumer is not None:  # (failed in set-up: exits now, and the driver sees it)
        consumer.close()


def consume(it, cfg: dict) -> dict:
    """One epoch: every batch's indices and a fingerprint of each image; the
    emulated step (--step-ms) sleeps, holding the batch."""
    import torch

    step = cfg["step_ms"] / 1e3
    seen: list[int] = []
    prints: list[float] = []
    t_first = t_last = None
    batches = 0
    for batch in it:
        images, labels, index = batch
        if t_first is None:
            t_first = time.monotonic()
        if (images.dtype != torch.float32 or tuple(images.shape[1:]) != (3, SIZE, SIZE)
                or len(labels) != len(images) or len(index) != len(images)):
            raise RuntimeError(f"unexpected batch: images {images.dtype} {tuple(images.shape)}, "
                               f"labels {tuple(labels.shape)}, index {tuple(index.shape)}")
        seen += index.tolist()
        # 8 x 8 x 3 pixels of each image: tells trials' augmentations apart, costs ~nothing
        prints += images[:, :, ::28, ::28].sum(dim=(1, 2, 3), dtype=torch.float64).tolist()
        batches += 1
        if step:
            time.sleep(step)
        t_last = time.monotonic()
    n = cfg["images"]
    distinct = set(seen)
    return {"t_first": t_first, "t_end": t_last, "samples": len(seen), "batches": batches,
            "distinct": len(distinct), "duplicated": len(seen) - len(distinct),
            "missing": n - len(distinct & set(range(n))),
            "foreign": len(distinct - set(range(n))),
            "exact": len(seen) == n and distinct == set(range(n)),
            "fingerprints": dict(zip(seen, prints))}


class _NoJoinNote(logging.Filter):
    """Drops the producer's note that a consumer joining mid-epoch would start at
    the next epoch (the gate is not a sampler it knows): every trial here joins
    before the start."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "no joining mid-epoch" not in record.getMessage()


def producer_main(system: str, k: int, cfg: dict, name: str, ready, go, leave, results) -> None:
    import torch

    torch.set_num_threads(1)
    logging.getLogger("batchcast").addFilter(_NoJoinNote())
    out: dict[str, Any] = {"who": "producer", "pid": os.getpid(), "error": None}
    set_up = False
    try:
        import batchcast as bc

        ops, decoded = datasets(cfg)
        # batchcast-shared: the producer augments once, with trial 0's parameters
        data = (ops.AugmentedImages(decoded, strength_of(0), seed_of(0))
                if system == "batchcast-shared" else decoded)
        loader, _ = make_loader(cfg, data, cfg["producer_workers"], 0, go)
        producer = bc.Producer(loader, name, epochs=1, min_consumers=k, slots=cfg["slots"])
        ready.put(("producer", os.getpid()))
        set_up = True
        producer.run()  # waits for the K trials; the loader's first index waits for the start
        try:
            out["stats"] = producer.stats()
        except Exception as exc:  # noqa: BLE001 - recorded, not fatal
            out["stats"] = {"error": repr(exc)}
    except BaseException as exc:  # noqa: BLE001 - reported: the run is marked failed
        out["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"
    out["cpu_self_s"] = cpu_seconds(resource.RUSAGE_SELF)
    out["cpu_children_s"] = cpu_seconds(resource.RUSAGE_CHILDREN)
    results.put(out)
    if set_up:  # (failed in set-up: exits now, and the driver sees it)
        leave.wait(cfg["run_timeout"])


# ---- the driver --------------------------------------------------------------------------
def set_subreaper() -> None:
    """Orphaned grandchildren (a killed trial's loader workers) become our
    children: their CPU is counted when we reap them, and none is left behind."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def tree_cpu() -> float | None:
    """CPU seconds of every descendant so far (reaped ones, live ones and the
    children those reaped); None without psutil."""
    try:
        import psutil
    except ImportError:
        return None
    total = cpu_seconds(resource.RUSAGE_CHILDREN)
    for p in psutil.Process().children(recursive=True):
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            pass
    return total


def machine_busy() -> float | None:
    """CPU seconds the whole machine has been busy (all processes, /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    busy = sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


class Failed(Exception):
    pass


def gather(q, want: set[str], procs: dict[str, Any], deadline: float, what: str,
           got: dict[str, Any] | None = None) -> dict:
    """Items from q, keyed by their first field or "who", into `got` until every
    name in `want` is there; a process of `want` that exits without one, or the
    deadline, fails the run."""
    got = {} if got is None else got
    while not want <= set(got):
        try:
            item = q.get(timeout=0.25)
            key = item[0] if isinstance(item, tuple) else item["who"]
            got[key] = item
            continue
        except queue.Empty:
            pass
        lost = [w for w in want - set(got) if procs[w].exitcode is not None]
        if lost or time.monotonic() > deadline:
            time.sleep(0.2)
            while True:  # what they put before exiting may still be in the pipe
                try:
                    item = q.get_nowait()
                    got[item[0] if isinstance(item, tuple) else item["who"]] = item
                except queue.Empty:
                    break
            missing = sorted(want - set(got))
            if missing:
                raise Failed(f"{what}: no word from {', '.join(missing)} "
                             + ("(exited: " + ", ".join(f"{w} {procs[w].exitcode}" for w in missing)
                                + ")" if lost else "(deadline)"))
    return got


def run(system: str, k: int, cfg: dict, repeat: int) -> dict:
    ctx = mp.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    go, leave = ctx.Event(), ctx.Event()
    name = f"augment-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    out: dict[str, Any] = {"system": system, "k": k, "repeat": repeat, "name": name,
                           "errors": [], "failed": True}
    cpu_before = cpu_seconds(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    deadline = started + cfg["run_timeout"]
    procs: dict[str, Any] = {}
    if system != "dataloader":
        procs["producer"] = ctx.Process(target=producer_main, name="producer",
                                        args=(system, k, cfg, name, ready, go, leave, results))
    for i in range(k):
        procs[f"trial{i}"] = ctx.Process(target=trial_main, name=f"trial{i}",
                                         args=(system, i, cfg, name, ready, go, leave, results))
    trials = [f"trial{i}" for i in range(k)]
    got: dict[str, Any] = {}
    try:
        for p in procs.values():
            p.start()
        gather(ready, set(procs), procs, deadline, "set-up")
        out["setup_s"] = time.monotonic() - started
        busy_go, cpu_go = machine_busy(), tree_cpu()
        t_go = time.monotonic()
        go.set()
        gather(results, set(trials), procs, deadline, "run", got)
        cpu_end, busy_end = tree_cpu(), machine_busy()  # every trial is done; all still alive
        t_measured = time.monotonic()
        leave.set()
        if "producer" in procs:
            gather(results, {"producer"}, procs, time.monotonic() + 60, "producer", got)
    except Failed as exc:
        out["errors"].append(str(exc))
        cpu_go = cpu_end = t_go = busy_go = busy_end = None
        while True:
            try:
                item = results.get(timeout=0.5)
                got[item["who"]] = item
            except queue.Empty:
                break
    finally:
        leave.set()
        go.set()
        grace = 5 if out["errors"] else 30  # a failed run's producer may wait for trials for ever
        for p in procs.values():
            p.join(timeout=grace)
        for p in procs.values():
            if p.exitcode is None:
                p.kill()
                p.join()
    out["cpu_to_exit_s"] = cpu_seconds(resource.RUSAGE_CHILDREN) - cpu_before  # start-up included
    out["wall_s"] = time.monotonic() - started
    for who, r in got.items():
        if r.get("error"):
            out["errors"].append(f"{who}: {r['error']}")
    for who, p in procs.items():
        if p.exitcode not in (0, None):
            out["errors"].append(f"{who} exited with {p.exitcode}")
    results_of = [got.get(t) for t in trials]
    out["producer"] = got.get("producer")
    if out["errors"] or t_go is None or any(r is None or r.get("t_end") is None
                                            for r in results_of):
        out["trials"] = [{k2: v for k2, v in (r or {}).items() if k2 != "fingerprints"}
                         for r in results_of]
        return out
    samples = sum(r["samples"] for r in results_of)
    window = max(r["t_end"] for r in results_of) - t_go
    cpu_s = (cpu_end - cpu_go) if cpu_go is not None and cpu_end is not None else None
    # the rest of the machine: CPUs busy with other work over the run (a compiler, tests...)
    elsewhere = None
    if cpu_s is not None and busy_go is not None and busy_end is not None:
        elsewhere = max(0.0, (busy_end - busy_go) - cpu_s) / (t_measured - t_go)
    out.update({
        "failed": False, "t_go": t_go, "window_s": window, "samples": samples,
        "samples_per_s": samples / window,
        "per_trial_samples_per_s": [r["samples"] / (r["t_end"] - t_go) for r in results_of],
        "first_batch_s": [r["t_first"] - t_go for r in results_of],
        "cpu_s": cpu_s, "cpu_ms_per_sample": 1e3 * cpu_s / samples if cpu_s else None,
        "cpus_busy_elsewhere": elsewhere, "loadavg_after": os.getloadavg()[0],
        "exact": all(r["exact"] for r in results_of),
        "same_as_trial0": same_as_first([r["fingerprints"] for r in results_of]),
    })
    out["trials"] = [{k2: v for k2, v in r.items() if k2 != "fingerprints"} for r in results_of]
    out["_fingerprints"] = [r["fingerprints"] for r in results_of]  # dropped before writing
    if not out["exact"]:
        out["errors"].append("MISMATCH: " + "; ".join(
            f"{r['who']} received {r['samples']} of {cfg['images']} ({r['distinct']} distinct, "
            f"{r['duplicated']} duplicated, {r['missing']} missing)" for r in results_of
            if not r["exact"]))
    return out


def same_share(a: dict, b: dict) -> float:
    """The share of the samples of `a` whose image has the same fingerprint in `b`."""
    common = [i for i in a if i in b]
    return sum(1 for i in common if a[i] == b[i]) / max(1, len(common))


def same_as_first(prints: list[dict]) -> list[float]:
    """For trials 1..K-1: the share of samples whose image has trial 0's fingerprint."""
    return [same_share(other, prints[0]) for other in prints[1:]]


def check_against_dataloader(res: dict, reference: list[dict] | None) -> None:
    """Each trial's images against the DataLoader run's of the same K: a
    batchcast-per-trial trial k must get exactly DataLoader trial k's
    augmentation of every sample (same function, same per-sample seed), a
    batchcast-shared trial the producer's (DataLoader trial 0's)."""
    prints = res.pop("_fingerprints", None)
    if res["failed"] or prints is None or reference is None or res["system"] == "dataloader":
        return
    if res["system"] == "batchcast-per-trial":
        shares = [same_share(p, ref) for p, ref in zip(prints, reference)]
    else:
        shares = [same_share(p, reference[0]) for p in prints]
    res["same_as_dataloader"] = shares
    if min(shares) < 1:
        res["errors"].append(
            "AUGMENTATION MISMATCH: " + ", ".join(
                f"trial{i} {s:.1%}" for i, s in enumerate(shares))
            + " of the samples got the DataLoader trial's augmentation "
            + ("(trial k's)" if res["system"] == "batchcast-per-trial" else "(trial 0's)"))


# ---- D, A and C, alone -------------------------------------------------------------------
def measure(cfg: dict) -> dict:
    """CPU (and wall) seconds per sample, one thread, this process: D decode +
    resize, C8 collating uint8 256x256 batches, A one trial's augmentation
    (its generator made per sample, as every system does), C collating float
    224x224 batches. Median of --measure-passes passes over the first
    --measure-samples files."""
    import torch

    torch.set_num_threads(1)
    ops, decoded = datasets(cfg)
    n = min(cfg["files"], cfg["measure_samples"])
    b = cfg["batch_size"]
    augment = ops.make_augment(strength_of(1))

    def timed(fn, *args) -> tuple[float, float, Any]:
        c, w = time.process_time(), time.perf_counter()
        value = fn(*args)
        return time.process_time() - c, time.perf_counter() - w, value

    def decode_all() -> list:
        return [decoded[i] for i in range(n)]

    def collate_all(samples: list) -> list:
        return [torch.stack([x[0] for x in samples[s:s + b]]) for s in range(0, n, b)]

    def augment_all(samples: list) -> list:
        return [augment(x, ops.sample_generator(seed_of(1), 0, x[2])) for x in samples]

    decode_all()  # warm: the files in the page cache
    passes: dict[str, list[tuple[float, float]]] = {"D": [], "C8": [], "A": [], "C": []}
    for _ in range(cfg["measure_passes"]):
        c, w, decoded_samples = timed(decode_all)
        passes["D"].append((c / n, w / n))
        c, w, _ = timed(collate_all, decoded_samples)
        passes["C8"].append((c / n, w / n))
        c, w, augmented = timed(augment_all, decoded_samples)
        passes["A"].append((c / n, w / n))
        c, w, _ = timed(collate_all, augmented)
        passes["C"].append((c / n, w / n))
    out: dict[str, Any] = {"samples": n, "passes": passes}
    for key, values in passes.items():
        out[key] = statistics.median(c for c, _ in values)
        out[key + "_wall"] = statistics.median(w for _, w in values)
    sizes = [os.path.getsize(decoded.path(i)) for i in range(n)]
    c, w, _ = timed(lambda: [_decode_only(decoded.path(i)) for i in range(n)])
    out.update(decode_only=c / n, decode_only_wall=w / n, file_kb=statistics.mean(sizes) / 1e3)
    return out


def _decode_only(path: str) -> None:
    from PIL import Image

    with Image.open(path) as img:
        img.convert("RGB")


def bounds(costs: dict, k: int, cpus: int) -> dict:
    d = costs["D"] + costs["C8"]
    a = costs["A"] + costs["C"]
    return {"speedup": k * (d + a) / (d + k * a),
            "dataloader": cpus / (d + a),
            "batchcast-shared": k * cpus / (d + a),
            "batchcast-per-trial": k * cpus / (d + k * a)}


# ---- the report --------------------------------------------------------------------------
def med_range(values: list[float], fmt: str = "{:,.0f}") -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return fmt.format(values[0])
    return (f"{fmt.format(statistics.median(values))} "
            f"[{fmt.format(min(values))}, {fmt.format(max(values))}]")


def augmentation_cell(runs: list[dict]) -> str:
    """Whether trials got their own augmentations, and whether a trial's images
    were bit for bit the DataLoader trial's of the same K (same function, same
    per-sample seed)."""
    shares = [s for r in runs for s in r.get("same_as_trial0", [])]
    cell = "–"
    if shares and max(shares) == 0:
        cell = "per trial"
    elif shares and min(shares) == 1:
        cell = "shared"
    elif shares:
        cell = f"{100 * min(shares):.0f}-{100 * max(shares):.0f}% as trial 0's"
    same = [s for r in runs for s in r.get("same_as_dataloader", [])]
    if same:
        note = ("= DataLoader's" if min(same) == 1 else f"{100 * min(same):.1f}% = DataLoader's")
        cell = note if cell == "–" else f"{cell}, {note}"
    return cell


def markdown(doc: dict) -> str:
    env, cfg, costs = doc["env"], doc["config"], doc["costs"]
    cpus = env["cpus_used"]
    def ms(seconds: float) -> str:
        return f"{1e3 * seconds:.2f}"

    lines = [
        "# Decode once, augment per trial: K trials with their own augmentation",
        "",
        f"{env['date']}, {env['cpu']}, {cpus} CPUs, Python {env['python']}, torch "
        f"{env['torch']}, batchcast {env['batchcast']} (git {env['git']}). "
        f"`python benchmarks/augment.py {' '.join(env['argv'])}`",
        "",
        f"{cfg['images']:,} samples per trial, one epoch (sample i decodes file i % "
        f"{cfg['files']}: photo-like JPEGs of 500x375, quality 90, "
        f"{costs['file_kb']:.0f} KB on average), batch {cfg['batch_size']}; trial k has colour "
        f"jitter strength 0.1 + 0.1 k and its own seed. DataLoader per trial: "
        f"{cfg['workers_note']} workers; the producer's DataLoader: "
        f"{cfg['producer_workers']} workers; per-trial consumers: {cfg['threads_note']} "
        f"transform threads. {cfg['repeats']} repeat(s), systems alternated; cells are median "
        f"[min, max].",
        "",
        f"Measured alone (one thread, CPU per sample): decode + resize to 256 **D = "
        f"{ms(costs['D'])} ms** (the JPEG decode alone {ms(costs['decode_only'])} ms; "
        f"collating its uint8 batches, counted with D, {ms(costs['C8'])} ms), one trial's "
        f"augmentation **A = "
        f"{ms(costs['A'])} ms** (collating its float batches C = {ms(costs['C'])} ms; A' = A + C "
        f"= {ms(costs['A'] + costs['C'])} ms). K trials cost K·(D + A') per sample apart, "
        f"D + K·A' with the decode shared: bound on the speed-up K·(D + A') / (D + K·A'). "
        f"Physical bounds on {cpus} CPUs, samples/s over all trials: DataLoader per trial "
        f"P / (D + A'), per-trial augmentation K·P / (D + K·A'), one shared augmentation "
        f"K·P / (D + A').",
        "",
    ]
    for note in doc.get("notes", []):
        lines += [f"**Note:** {note}", ""]
    lines += ["| K | bound speed-up K(D+A')/(D+KA') | batchcast-per-trial / dataloader | "
              "share of the bound | batchcast-shared / dataloader |", "|---|---|---|---|---|"]
    by = {}
    for r in doc["runs"]:
        by.setdefault((r["k"], r["system"]), []).append(r)

    def rates(k, system):
        return [r["samples_per_s"] for r in by.get((k, system), []) if not r["failed"]]

    for k in cfg["ks"]:
        b = bounds(costs, k, cpus)
        base = rates(k, "dataloader")
        cells = []
        for system in ("batchcast-per-trial", "batchcast-shared"):
            got = rates(k, system)
            cells.append(f"{statistics.median(got) / statistics.median(base):.2f}x"
                         if got and base else "–")
        share = "–"
        if got_pt := rates(k, "batchcast-per-trial"):
            speedup = statistics.median(got_pt) / statistics.median(base) if base else None
            if speedup is not None:
                share = f"{speedup / b['speedup']:.0%}"
                if b["speedup"] > 1.01:
                    share += f" ({(speedup - 1) / (b['speedup'] - 1):.0%} of the gain)"
        lines.append(f"| {k} | {b['speedup']:.2f}x | {cells[0]} | {share} | {cells[1]} |")
    lines += ["", "| K | system | samples/s, all trials | physical bound | share | per trial "
              "samples/s | CPU ms per sample | first batch s | each sample once | "
              "augmentations | CPUs busy elsewhere |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for k in cfg["ks"]:
        b = bounds(costs, k, cpus)
        for system in cfg["systems"]:
            runs = by.get((k, system), [])
            if system in doc.get("skipped", {}):
                lines.append(f"| {k} | {system} | {doc['skipped'][system].split(':')[0]} | "
                             f"{b[system]:,.0f} | | | | | | | |")
                continue
            ok = [r for r in runs if not r["failed"]]
            failed = len(runs) - len(ok)
            rate = [r["samples_per_s"] for r in ok]
            share = f"{statistics.median(rate) / b[system]:.0%}" if rate else "–"
            per_trial = [statistics.mean(r["per_trial_samples_per_s"]) for r in ok]
            cpu = [r["cpu_ms_per_sample"] for r in ok if r.get("cpu_ms_per_sample")]
            first = [statistics.median(r["first_batch_s"]) for r in ok]
            other = [r["cpus_busy_elsewhere"] for r in ok
                     if r.get("cpus_busy_elsewhere") is not None]
            once = ("yes" if ok and all(r["exact"] for r in ok) else "**NO**" if ok else "–")
            note = f" ({failed} of {len(runs)} runs failed)" if failed else ""
            lines.append(f"| {k} | {system}{note} | {med_range(rate)} | {b[system]:,.0f} | "
                         f"{share} | {med_range(per_trial)} | {med_range(cpu, '{:.2f}')} | "
                         f"{med_range(first, '{:.2f}')} | {once} | {augmentation_cell(ok)} | "
                         f"{med_range(other, '{:.2f}')} |")
    lines += [
        "",
        "- samples/s: samples all trials received / (the last trial's last sample − the "
        "common start); per trial: its samples / its own last sample − start (mean of the "
        "trials).",
        "- CPU ms per sample: user + system of every process of the run (trials, producer, "
        "loader workers) from the start to the last trial's last sample, per sample received.",
        "- augmentations: per trial when no trial's image of a sample matched trial 0's (a "
        "fingerprint of 8×8×3 pixels per image), shared when all did; \"= DataLoader's\": "
        "every image was the one the DataLoader run of that K gave the same trial (trial 0 "
        "for batchcast-shared), i.e. the same augmentation drawn from the same per-sample "
        "seed.",
        "- the trials do not train (no step): the rates are what the loading delivers, on "
        "CPUs the trials do not use otherwise.",
        "- CPUs busy elsewhere: the machine's busy CPU time over the run (/proc/stat) less "
        "the run's own, per second: other work sharing the CPUs (0 on a quiet machine).",
    ]
    other = [r["cpus_busy_elsewhere"] for r in doc["runs"]
             if r.get("cpus_busy_elsewhere") is not None]
    if other and max(other) > 0.2:
        lines[lines.index("| K | bound speed-up K(D+A')/(D+KA') | batchcast-per-trial / "
                          "dataloader | share of the bound | batchcast-shared / dataloader |")
              :0] = [f"**The machine was not quiet:** other work kept up to {max(other):.2f} "
                     f"CPUs busy during some runs (median {statistics.median(other):.2f}); the "
                     "rates are low and noisy against the bounds. Rerun on a quiet machine.", ""]
    errors = [f"K={r['k']} {r['system']} #{r['repeat']}: {e}" for r in doc["runs"]
              for e in r["errors"]]
    if errors:
        lines += ["", "## Errors", ""] + [f"- {e.splitlines()[0]}" for e in errors]
    return "\n".join(lines) + "\n"


def one_line(r: dict) -> str:
    if r["failed"]:
        return (f"K={r['k']} {r['system']:<20} FAILED: "
                + " | ".join(e.splitlines()[0] for e in r["errors"]))
    cpu = f"{r['cpu_ms_per_sample']:.2f}" if r.get("cpu_ms_per_sample") else "?"
    same = r["same_as_trial0"]
    return (f"K={r['k']} {r['system']:<20} {r['samples_per_s']:7.1f} samples/s in "
            f"{r['window_s']:5.1f} s, CPU {cpu} ms/sample, first batch "
            f"{statistics.median(r['first_batch_s']):.2f} s, "
            f"{'exact' if r['exact'] else 'NOT EXACT'}"
            + (f", same as trial 0: {max(same):.0%}" if same else "")
            + (f", DataLoader's augmentation: {min(r['same_as_dataloader']):.0%}"
               if r.get("same_as_dataloader") else "")
            + (f", other work: {r['cpus_busy_elsewhere']:.2f} CPUs"
               if r.get("cpus_busy_elsewhere") is not None else "")
            + "".join(f"; {e.splitlines()[0]}" for e in r["errors"]))


# ---- main ----------------------------------------------------------------------------------
def environment(args) -> dict:
    import torch

    try:
        import batchcast

        version = getattr(batchcast, "__version__", "?")
    except ImportError:
        version = "not installed"
    with open("/proc/cpuinfo") as f:
        model = next((line.split(":", 1)[1].strip() for line in f
                      if line.startswith("model name")), platform.processor())
    try:
        git = subprocess.run(["git", "-C", str(HERE), "describe", "--always", "--dirty"],
                             check=False, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        git = "?"
    try:
        from PIL import __version__ as pil
    except ImportError:
        pil = None
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "cpu": model,
            "cpus": os.cpu_count(), "cpus_used": len(os.sched_getaffinity(0)),
            "python": platform.python_version(), "torch": torch.__version__, "pillow": pil,
            "batchcast": version, "git": git or "?", "argv": sys.argv[1:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", type=int, nargs="+", default=None,
                    help="trial counts (default 1 2 4; 8 adds ~7 min on 2 CPUs)")
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS, default=SYSTEMS)
    ap.add_argument("--images", type=int, default=4096, help="samples per trial (one epoch)")
    ap.add_argument("--files", type=int, default=512,
                    help="distinct JPEG files (sample i decodes file i %% files)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64,
                    help="every trial's batch size, and the producer's loader's")
    ap.add_argument("--workers", type=int, default=None,
                    help="DataLoader workers of each trial's own loader "
                         "(default max(1, CPUs // K))")
    ap.add_argument("--producer-workers", type=int, default=None,
                    help="workers of the producer's DataLoader (default: the CPUs)")
    ap.add_argument("--threads", type=int, default=None,
                    help="transform_threads of each per-trial consumer (default max(1, CPUs // K))")
    ap.add_argument("--slots", type=int, default=8, help="the producer's ring slots")
    ap.add_argument("--step-ms", type=float, default=0.0,
                    help="emulated training step per batch (sleep; default none)")
    ap.add_argument("--timeout", type=float, default=120.0, help="consumers' timeout")
    ap.add_argument("--run-timeout", type=float, default=600.0, help="seconds one run may take")
    ap.add_argument("--measure-samples", type=int, default=128,
                    help="files D, A and C are measured over")
    ap.add_argument("--measure-passes", type=int, default=5)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: K = 1 2, 256 images, 1 repeat, into benchmarks/.cache/quick/")
    ap.add_argument("--out", default=None,
                    help="markdown file (default benchmarks/results/augment.md); the JSON beside it")
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:  # in a process of its own (one thread, nothing else loaded)
        print(json.dumps(measure(json.loads(args.measure))))
        return
    if args.quick:
        args.ks = args.ks or [1, 2]
        args.images, args.files, args.repeats = 256, 64, 1
        args.batch_size, args.measure_samples, args.measure_passes = 32, 32, 3
        args.run_timeout = min(args.run_timeout, 120.0)
    args.ks = args.ks or [1, 2, 4]
    out = Path(args.out) if args.out else (
        HERE / ".cache" / "quick" / "augment.md" if args.quick else HERE / "results" / "augment.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out_json = out.with_suffix(".json")
    try:
        import PIL  # noqa: F401
    except ImportError:
        sys.exit("augment.py needs Pillow: pip install pillow")
    import _augment_ops as ops

    cpus = len(os.sched_getaffinity(0))
    folder = ops.ensure_photos(HERE / ".cache", args.files)
    cfg = {"folder": str(folder), "images": args.images, "files": args.files,
           "batch_size": args.batch_size, "slots": args.slots, "step_ms": args.step_ms,
           "timeout": args.timeout, "run_timeout": args.run_timeout,
           "producer_workers": args.producer_workers if args.producer_workers is not None
           else cpus,
           "measure_samples": args.measure_samples, "measure_passes": args.measure_passes}
    config = {**vars(args), "out": str(out), "folder": str(folder),
              "producer_workers": cfg["producer_workers"],
              "workers_note": (str(args.workers) if args.workers is not None
                               else f"max(1, {cpus} // K)"),
              "threads_note": (str(args.threads) if args.threads is not None
                               else f"max(1, {cpus} // K)")}
    del config["measure"]
    env = environment(args)
    skipped: dict[str, str] = {}
    if "batchcast-per-trial" in args.systems and (why := per_trial_missing()):
        skipped["batchcast-per-trial"] = why
        print(f"batchcast-per-trial: {why}; skipped", flush=True)
    if any(s != "dataloader" for s in args.systems) and "batchcast-shared" not in skipped:
        try:
            import batchcast  # noqa: F401
        except ImportError as exc:
            for s in args.systems:
                if s != "dataloader":
                    skipped[s] = f"batchcast does not import: {exc}"

    print("measuring D (decode + resize), A (augmentation) and C (collate), one thread ...",
          flush=True)
    measured = subprocess.run([sys.executable, __file__, "--measure", json.dumps(cfg)],
                              check=False, capture_output=True, text=True)
    if measured.returncode != 0:
        sys.exit(f"measuring failed:\n{measured.stderr}")
    costs = json.loads(measured.stdout.strip().splitlines()[-1])
    print(f"D = {1e3 * costs['D']:.2f} ms (decode alone {1e3 * costs['decode_only']:.2f} ms, "
          f"{costs['file_kb']:.0f} KB files), A = {1e3 * costs['A']:.2f} ms, C = "
          f"{1e3 * costs['C']:.2f} ms, C8 = {1e3 * costs['C8']:.2f} ms per sample (CPU)",
          flush=True)
    for k in args.ks:
        b = bounds(costs, k, cpus)
        print(f"K={k}: bound speed-up {b['speedup']:.2f}x; physical bounds (samples/s): "
              + ", ".join(f"{s} {b[s]:,.0f}" for s in SYSTEMS), flush=True)

    set_subreaper()
    tmp = tempfile.mkdtemp(prefix="augment-bench-")
    os.environ.setdefault("BATCHCAST_RUNTIME_DIR", os.path.join(tmp, "runtime"))
    systems = [s for s in args.systems if s not in skipped]
    doc: dict[str, Any] = {"env": env, "config": config, "costs": costs, "skipped": skipped,
                           "notes": [], "runs": []}
    if "batchcast-per-trial" in skipped:
        doc["notes"].append(f"batchcast-per-trial was not run: {skipped['batchcast-per-trial']}.")
    started = time.monotonic()
    total = len(args.ks) * args.repeats * len(systems)
    try:
        for k in args.ks:
            cfg["workers"] = args.workers if args.workers is not None else max(1, cpus // k)
            cfg["threads"] = args.threads if args.threads is not None else max(1, cpus // k)
            reference: list[dict] | None = None  # the DataLoader run's images of this K
            for r in range(args.repeats):
                for system in systems:
                    res = run(system, k, cfg, r)
                    if system == "dataloader":
                        reference = None if res["failed"] else res.get("_fingerprints")
                    check_against_dataloader(res, reference)
                    res.pop("_fingerprints", None)
                    res["workers"] = cfg["workers"] if system == "dataloader" else None
                    res["threads"] = cfg["threads"] if system == "batchcast-per-trial" else None
                    doc["runs"].append(res)
                    print(f"[{len(doc['runs'])}/{total} {time.monotonic() - started:5.0f}s] "
                          f"{one_line(res)}", flush=True)
                    out_json.write_text(json.dumps(doc, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    doc["elapsed_s"] = time.monotonic() - started
    out_json.write_text(json.dumps(doc, indent=1))
    text = markdown(doc)
    out.write_text(text)
    print("\n" + text)
    print(f"written: {out}, {out_json}")
    bad = [r for r in doc["runs"] if r["failed"] or not r.get("exact") or r["errors"]]
    if bad:
        sys.exit(f"{len(bad)} run(s) failed or did not deliver every sample exactly once: "
                 + "; ".join(f"K={r['k']} {r['system']} #{r['repeat']}: "
                             + (r["errors"][0].splitlines()[0] if r["errors"] else "not exact")
                             for r in bad))


if __name__ == "__main__":
    main()

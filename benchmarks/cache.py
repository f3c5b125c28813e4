"""Decode once per sweep: the producer's decoded cache (``cache=``) in an
augmentation sweep of K trials over E epochs, against per-trial caches.

    python benchmarks/cache.py                           # K = 1 2 4 8, E = 4, 3 repeats
    python benchmarks/cache.py --ks 1 2 4 --images 2048 --repeats 2
    python benchmarks/cache.py --quick                   # smoke run (~3 min), into benchmarks/.cache/quick/

The data, the trials and the pieces are benchmarks/augment.py's (and
_augment_ops.py's): --images samples per epoch (sample i decodes file i %
--files: photo-like JPEGs of 500x375, ~120 KB), decoded and resized to uint8
3x256x256 (D), augmented per trial to float32 3x224x224 (A' = A + collate C),
trial k with colour-jitter strength 0.1 + 0.1 k and seed 1000 + k; each
sample's augmentation is drawn from a generator seeded by (trial seed, epoch,
dataset index), so every system gives trial k the same images, bit for bit
(checked against the DataLoader run of the same K and repeat).

Systems, all with K trials of E epochs each (every trial takes every sample
of every epoch once; the run fails loudly otherwise):

  dataloader         every trial has its own DataLoader that decodes and augments
                     every sample every epoch (--workers workers each, default
                     max(1, CPUs // K); persistent_workers=True)
  dataloader-cached  every trial has its own DataLoader whose dataset keeps the
                     decoded uint8 samples of its first epoch and augments them
                     in later ones (what Ultralytics' cache=ram does per
                     training: K copies). The cache is an N x 3x256x256 uint8
                     tensor in anonymous shared memory (MAP_SHARED) that the
                     trial makes before its loader forks its workers: the worker
                     that decodes a sample writes it there, any worker of a
                     later epoch reads it (persistent_workers=True; the epoch
                     number for the augmentation seeds is in shared memory too).
                     Ultralytics fills its list before training in the main
                     process and lets forked workers share it copy-on-write:
                     one copy per trial either way, and here the first epoch
                     fills it instead of a pass before training.
  batchcast          one producer whose DataLoader (--producer-workers, default
                     the CPUs) decodes every epoch; each trial is a
                     bc.Consumer(..., transform=bc.Augment(augment, seed=...,
                     threads=T)) (T = --threads, default max(1, CPUs // K))
  batchcast-cache    the same with Producer(..., cache="memory"): the loader runs
                     the first epoch only; later epochs are gathered from the
                     producer's kept samples (one copy whatever K)
  batchcast-warm     the second sweep: Producer(..., cache=bc.Cache("disk",
                     directory=...)) whose file a producer of the same name
                     made before the runs (one epoch, one trial: "the first
                     sweep", reported apart); every epoch, the first included,
                     comes from the file (mapped; it is in the page cache as the
                     first sweep left it, unless --cold-file drops its pages
                     before each run)

Every process is set up (imports, loader built, consumer connected) before a
common start signal. Measured per run: samples/s over the sweep (all trials'
samples / (the last trial's last sample - the start)) and per epoch (the K x N
samples of epoch e / the time between the last trial's end of epoch e-1 and of
epoch e); CPU (user + system, psutil) of every process per sample received,
per epoch and per role (producer with its loader workers; trials with theirs);
the producer's own CPU per dataset sample in epochs >= 2 (from its epoch
boundaries, noted in the producer process); the cache's size (Producer.stats());
and the memory of every process (psutil memory_full_info: rss, shared, uss,
pss): the trials and their workers once every trial has taken its last
sample (all still alive), the producer as its last epoch begins (it frees its
cache when it has served). The sum of the pss is the sweep's memory; the pss
of the mappings that hold decoded samples (the producer's kept rows, the disk
cache's file, each trial's own cache), over one decoded copy (N x 196,608
bytes), is how many copies of the decoded data the sweep holds; batchcast's
ring (its memfd) is reported apart.

Bounds, from D (decode + resize + its uint8 collate) and A' (augment + float
collate), measured first, alone, one thread, as augment.py does: CPU per sample
received D + A' (dataloader), D/E + A' (dataloader-cached), D/K + A'
(batchcast), D/(E K) + A' (batchcast-cache), A' (batchcast-warm); on P CPUs a
system delivers at most P / that. The speed-up bounds of the issue:
batchcast-cache over dataloader K (D + A') / (D/E + K A'), over batchcast
(D + K A') / (D/E + K A'). Targets: >= 90% of both at every K; the warm
sweep's first epoch as fast as its later ones (>= 90% here); one decoded copy
whatever K.

Medians [min, max] over --repeats runs, the systems alternated. Writes --out
(default benchmarks/results/cache.md) and the raw measurements beside it
(cache.json). dataloader-cached needs K x N x 196 KB of memory (6.4 GB at K = 8,
N = 4096).
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import math
import mmap
import multiprocessing as mp
import os
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

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import augment as aug  # noqa: E402  (the trials, the loaders, the measuring, the driver's tools)
from torch.utils.data import Dataset  # noqa: E402

SYSTEMS = ["dataloader", "dataloader-cached", "batchcast", "batchcast-cache", "batchcast-warm"]
BATCHCAST = {"batchcast", "batchcast-cache", "batchcast-warm"}
UNCACHED = {"dataloader-cached": "dataloader", "batchcast-cache": "batchcast",
            "batchcast-warm": "batchcast"}
SIDE = 256  # the decoded samples: uint8 3 x 256 x 256
ROW_BYTES = 3 * SIDE * SIDE


# ---- a trial's own DataLoader, with or without its own cache ----------------------------
def shared_tensor(shape: tuple[int, ...], dtype) -> Any:
    """Zeros in anonymous shared memory (MAP_SHARED): a forked loader worker's
    writes are its parent's and every other worker's (no /dev/shm file)."""
    import torch

    count = math.prod(shape)
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    buffer = mmap.mmap(-1, max(1, nbytes))  # the tensor keeps it alive
    return torch.frombuffer(buffer, dtype=dtype, count=count).view(shape)


class TrialImages(Dataset):
    """One trial's data for its own DataLoader: DecodedImages + the trial's
    augmentation, seeded per sample by (seed, epoch, index) as a batchcast
    consumer seeds it. The epoch is read from shared memory (the workers are
    persistent). With cache=True, each sample is decoded once (by whichever
    worker gets it first) into the trial's own decoded copy, shared by its
    workers, and augmented from there afterwards."""

    def __init__(self, decoded, strength: float, seed: int, cache: bool) -> None:
        import torch

        self.decoded, self.strength, self.seed = decoded, strength, seed
        self.epoch = shared_tensor((1,), torch.int64)
        self.rows = self.have = None
        if cache:
            self.rows = shared_tensor((len(decoded), 3, decoded.size, decoded.size), torch.uint8)
            self.have = shared_tensor((len(decoded),), torch.uint8)

    def __len__(self) -> int:
        return len(self.decoded)

    def __getitem__(self, index: int):
        import _augment_ops as ops

        if self.rows is None:
            sample = self.decoded[index]
        elif self.have[index]:
            sample = (self.rows[index], index % 1000, index)  # DecodedImages' label and index
        else:
            sample = self.decoded[index]
            self.rows[index].copy_(sample[0])
            self.have[index] = 1
        generator = ops.sample_generator(self.seed, int(self.epoch[0]), index)
        return ops.augment_sample(sample, generator, self.strength)


def trial_loader(cfg: dict, dataset, workers: int, seed: int, go):
    """augment.make_loader's loader, with persistent workers (E epochs)."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    generator = torch.Generator().manual_seed(seed)
    sampler = aug.GatedSampler(RandomSampler(dataset, generator=generator), go)
    loader = DataLoader(dataset, batch_size=cfg["batch_size"], sampler=sampler,
                        num_workers=workers, worker_init_fn=aug._worker_init if workers else None,
                        multiprocessing_context="fork" if workers else None,
                        persistent_workers=workers > 0)
    return loader, sampler


# ---- the processes -------------------------------------------------------------------------
def trial_main(system: str, index: int, cfg: dict, name: str, ready, go, leave, progress,
               results) -> None:
    import torch

    torch.set_num_threads(1)
    who = f"trial{index}"
    out: dict[str, Any] = {"who": who, "pid": os.getpid(), "error": None,
                           "strength": aug.strength_of(index), "seed": aug.seed_of(index)}
    consumer = loader = None
    set_up = False
    try:
        ops, decoded = aug.datasets(cfg)
        if system.startswith("dataloader"):
            data = TrialImages(decoded, aug.strength_of(index), aug.seed_of(index),
                               cache=system == "dataloader-cached")
            loader, gate = trial_loader(cfg, data, cfg["workers"], aug.seed_of(index), go)
            holder: dict[str, Any] = {}

            def start() -> None:  # blocks in the gate (workers started) until the start
                try:
                    holder["it"] = iter(loader)
                except BaseException as exc:  # noqa: BLE001 - raised below
                    holder["error"] = exc
                gate.arrived.set()

            starter = threading.Thread(target=start, name="loader-start", daemon=True)
            starter.start()
            gate.arrived.wait()
            if "error" in holder:
                raise holder["error"]
        else:
            import batchcast as bc

            augment = ops.make_augment(aug.strength_of(index))
            consumer = bc.Consumer(name, batch_size=cfg["batch_size"], timeout=cfg["timeout"],
                                   transform=bc.Augment(augment, seed=aug.seed_of(index),
                                                        threads=cfg["threads"]))
        if loader is not None and data.rows is not None:
            out["decoded_at"] = data.rows.data_ptr()  # (its loader's workers have it there too)
        ready.put((who, os.getpid()))
        set_up = True
        go.wait()
        epochs, prints = [], []
        for epoch in range(cfg["epochs"]):
            if loader is not None:
                if epoch == 0:
                    starter.join()
                    if "error" in holder:
                        raise holder["error"]
                    it = holder.pop("it")
                else:
                    data.epoch[0] = epoch  # read by the (persistent) workers from now on
                    it = iter(loader)
            else:
                it = iter(consumer)
            got = aug.consume(it, cfg)
            del it
            progress.put((who, epoch, got["t_end"]))
            prints.append(got.pop("fingerprints"))
            epochs.append(got)
        out["epochs"] = epochs
        out["fingerprints"] = prints
        out["exact"] = all(e["exact"] for e in epochs)
    except BaseException as exc:  # noqa: BLE001 - reported: the run is marked failed
        out["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"
    out["cpu_self_s"] = aug.cpu_seconds(resource.RUSAGE_SELF)
    if consumer is not None:
        try:
            out["consumer_stats"] = consumer.stats()
        except Exception as exc:  # noqa: BLE001 - recorded, not fatal
            out["consumer_stats"] = {"error": repr(exc)}
    results.put(out)
    if set_up:  # alive (workers and all) until the driver has read CPU and memory
        leave.wait(cfg["run_timeout"])
    if consumer is not None:
        consumer.close()
    del loader


def memory_rows(pid: int, who: str, children: bool = True,
                decoded_at: int | None = None) -> list[dict]:
    """psutil memory_full_info of a process (and its descendants, as who-worker),
    and the part of its rss and pss in the decoded samples (the mapping that
    holds address `decoded_at`: a forked worker has it at the same address; or
    a disk cache's file) and in batchcast's ring (its memfd)."""
    import psutil

    rows = []
    try:
        top = psutil.Process(pid)
        tree = [(top, who)] + ([(c, f"{who}-worker") for c in top.children(recursive=True)]
                               if children else [])
    except psutil.Error:
        return rows
    for p, role in tree:
        try:
            m = p.memory_full_info()
            maps = p.memory_maps(grouped=False)
        except psutil.Error:
            continue
        row = {"who": role, "pid": p.pid, "rss": m.rss, "shared": m.shared, "uss": m.uss,
               "pss": m.pss, "swap": m.swap, "decoded_rss": 0, "decoded_pss": 0, "ring_rss": 0,
               "ring_pss": 0}
        for mapping in maps:
            start, end = (int(x, 16) for x in mapping.addr.split("-"))
            if mapping.path.endswith(".batchcast-cache") or (
                    decoded_at is not None and start <= decoded_at < end):
                kind = "decoded"
            elif "memfd:batchcast" in mapping.path:
                kind = "ring"
            else:
                continue
            row[f"{kind}_rss"] += mapping.rss
            row[f"{kind}_pss"] += mapping.pss
        rows.append(row)
    return rows


def kept_address(producer) -> int | None:
    """Where the producer keeps its decoded samples (a private attribute of
    batchcast's: None where it is not there)."""
    try:
        return next(k.rows.data_ptr() for k in producer._cache.kept if k.rows is not None)
    except (AttributeError, StopIteration, TypeError):
        return None


def producer_cpu() -> float:
    return aug.cpu_seconds(resource.RUSAGE_SELF) + aug.cpu_seconds(resource.RUSAGE_CHILDREN)


def producer_main(system: str, k: int, cfg: dict, name: str, ready, go, leave, progress,
                  results) -> None:
    import torch

    torch.set_num_threads(1)
    logging.getLogger("batchcast").addFilter(aug._NoJoinNote())
    out: dict[str, Any] = {"who": "producer", "pid": os.getpid(), "error": None, "marks": []}
    set_up = False
    stop = threading.Event()
    try:
        import batchcast as bc
        import psutil  # (now, not in an epoch measured)

        ops, decoded = aug.datasets(cfg)
        loader, _ = aug.make_loader(cfg, decoded, cfg["producer_workers"], 0, go)
        cache = {"batchcast": None, "batchcast-cache": "memory"}.get(
            system, bc.Cache("disk", directory=cfg["cache_dir"]))
        producer = bc.Producer(loader, name, epochs=cfg["epochs"], min_consumers=k,
                               slots=cfg["slots"], cache=cache)

        def monitor() -> None:
            """Notes the producer's CPU (its own and its reaped loader workers')
            as each epoch begins, and its memory as the last one begins."""
            seen = 0
            while not stop.is_set():
                begun = producer.epochs_begun
                if begun != seen:
                    seen = begun
                    out["marks"].append({"epoch": begun - 1, "t": time.monotonic(),
                                         "cpu_s": producer_cpu()})
                    if begun == cfg["epochs"]:
                        # (an uncached epoch: once its loader's workers are up, so that every
                        # run counts them; a cached one has none, and frees its cache when done)
                        if system == "batchcast":
                            up = time.monotonic() + 2
                            while not psutil.Process().children() and time.monotonic() < up:
                                stop.wait(0.01)
                        spent = time.thread_time()
                        out["memory"] = memory_rows(os.getpid(), "producer",
                                                    decoded_at=kept_address(producer))
                        out["memory_cpu_s"] = time.thread_time() - spent
                if producer.epochs_served == cfg["epochs"] and "served" not in out:
                    out["served"] = {"t": time.monotonic(), "cpu_s": producer_cpu()}
                stop.wait(0.005)
            out["monitor_cpu_s"] = time.thread_time()

        watcher = threading.Thread(target=monitor, name="epoch-marks", daemon=True)
        watcher.start()
        ready.put(("producer", os.getpid()))
        set_up = True
        try:
            producer.run()
        finally:
            out["t_done"] = time.monotonic()
            out["cpu_done_s"] = producer_cpu()
            stop.set()
            watcher.join()
        out["maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        try:
            out["stats"] = producer.stats()
        except Exception as exc:  # noqa: BLE001 - recorded, not fatal
            out["stats"] = {"error": repr(exc)}
    except BaseException as exc:  # noqa: BLE001 - reported: the run is marked failed
        out["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"
    stop.set()
    out["cpu_self_s"] = aug.cpu_seconds(resource.RUSAGE_SELF)
    out["cpu_children_s"] = aug.cpu_seconds(resource.RUSAGE_CHILDREN)
    results.put(out)
    if set_up:
        leave.wait(cfg["run_timeout"])


# ---- the driver ------------------------------------------------------------------------------
def subtree_cpu(pid: int) -> float | None:
    """CPU seconds of a process, its reaped children and its live descendants."""
    import psutil

    try:
        top = psutil.Process(pid)
        procs = [top] + top.children(recursive=True)
    except psutil.Error:
        return None
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total


def snapshot(pids: dict[str, int]) -> dict:
    return {"t": time.monotonic(), "cpu_s": aug.tree_cpu(),
            "roles": {who: subtree_cpu(pid) for who, pid in pids.items()}}


def roles_between(a: dict, b: dict, pids: dict, samples: int) -> dict:
    """CPU ms per sample of the producer (with its workers) and of the trials
    (with theirs) between two snapshots."""
    out = {}
    for role in ("producer", "trials"):
        who = [w for w in pids if w.startswith(role.rstrip("s"))]
        spent = [None if a["roles"].get(w) is None or b["roles"].get(w) is None
                 else b["roles"][w] - a["roles"][w] for w in who]
        if who and None not in spent:
            out[role] = 1e3 * sum(spent) / samples
    return out


def meminfo() -> dict[str, int]:
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, value = line.split(":", 1)
                if key in ("MemAvailable", "Shmem", "Cached"):
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def run(system: str, k: int, cfg: dict, repeat: int, name: str | None = None) -> dict:
    ctx = mp.get_context("spawn")
    ready, progress, results = ctx.Queue(), ctx.Queue(), ctx.Queue()
    go, leave = ctx.Event(), ctx.Event()
    name = name or f"cache-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    epochs, n = cfg["epochs"], cfg["images"]
    out: dict[str, Any] = {"system": system, "k": k, "repeat": repeat, "name": name,
                           "epochs": epochs, "errors": [], "failed": True}
    started = time.monotonic()
    deadline = started + cfg["run_timeout"]
    procs: dict[str, Any] = {}
    if system.startswith("batchcast"):  # (and the first sweep, batchcast-warm-build)
        procs["producer"] = ctx.Process(target=producer_main, name="producer",
                                        args=(system, k, cfg, name, ready, go, leave, progress,
                                              results))
    for i in range(k):
        procs[f"trial{i}"] = ctx.Process(target=trial_main, name=f"trial{i}",
                                         args=(system, i, cfg, name, ready, go, leave, progress,
                                               results))
    trials = [f"trial{i}" for i in range(k)]
    got: dict[str, Any] = {}
    marks: list[dict] = []
    t_go = None
    try:
        for p in procs.values():
            p.start()
        pids = {who: pid for who, (_, pid) in
                aug.gather(ready, set(procs), procs, deadline, "set-up").items()}
        out["setup_s"] = time.monotonic() - started
        out["meminfo_go"] = meminfo()
        busy_go = aug.machine_busy()
        go_mark = snapshot(pids)
        t_go = time.monotonic()
        go.set()
        done: dict[int, set] = {}
        while len(marks) < epochs:  # each trial's epoch ends; CPU noted as each epoch ends
            try:
                who, epoch, _t = progress.get(timeout=0.25)
                done.setdefault(epoch, set()).add(who)
                while len(marks) < epochs and len(done.get(len(marks), ())) == k:
                    marks.append(snapshot(pids))
                continue
            except queue.Empty:
                pass
            try:  # a trial (or the producer) that failed says so here
                item = results.get_nowait()
                got[item["who"]] = item
                if item.get("error"):
                    raise aug.Failed(f"run: {item['who']} failed after {len(marks)} of {epochs} "
                                     "epochs")
            except queue.Empty:
                pass
            lost = [w for w in procs if procs[w].exitcode is not None]
            if lost or time.monotonic() > deadline:
                aug.gather(results, set(trials), procs, time.monotonic() + 2, "run", got)
                raise aug.Failed("run: " + (f"{', '.join(lost)} exited" if lost else "deadline")
                                 + f" after {len(marks)} of {epochs} epochs")
        aug.gather(results, set(trials), procs, deadline, "run", got)
        busy_end = aug.machine_busy()
        t_measured = time.monotonic()
        out["meminfo_end"] = meminfo()
        out["memory"] = [row for i in range(k) for row in memory_rows(
            pids[f"trial{i}"], f"trial{i}", decoded_at=got[f"trial{i}"].get("decoded_at"))]
        leave.set()
        if "producer" in procs:
            aug.gather(results, {"producer"}, procs, time.monotonic() + 60, "producer", got)
    except aug.Failed as exc:
        out["errors"].append(str(exc))
        t_go = None
        while True:
            try:
                item = results.get(timeout=0.5)
                got[item["who"]] = item
            except queue.Empty:
                break
    finally:
        leave.set()
        go.set()
        grace = 5 if out["errors"] else 30
        for p in procs.values():
            p.join(timeout=grace)
        for p in procs.values():
            if p.exitcode is None:
                p.kill()
                p.join()
    out["wall_s"] = time.monotonic() - started
    for who, r in got.items():
        if r.get("error"):
            out["errors"].append(f"{who}: {r['error']}")
    for who, p in procs.items():
        if p.exitcode not in (0, None):
            out["errors"].append(f"{who} exited with {p.exitcode}")
    producer = got.get("producer")
    if producer is not None:
        out["producer"] = {key: producer.get(key) for key in
                           ("stats", "marks", "served", "maxrss", "cpu_self_s", "cpu_children_s",
                            "cpu_done_s", "t_done", "memory_cpu_s", "monitor_cpu_s")}
        out["memory"] = producer.get("memory", []) + out.get("memory", [])
    res = [got.get(t) for t in trials]
    out["trials"] = [{key: v for key, v in (r or {}).items() if key != "fingerprints"}
                     for r in res]
    if out["errors"] or t_go is None or any(r is None or "epochs" not in r for r in res):
        return out
    # the rates: epoch e ends with the last trial's last sample of it
    ends = [max(r["epochs"][e]["t_end"] for r in res) for e in range(epochs)]
    bounds = [t_go] + ends
    samples = sum(e["samples"] for r in res for e in r["epochs"])
    window = ends[-1] - t_go
    cpu = [m["cpu_s"] for m in [go_mark] + marks]
    cpu_s = cpu[-1] - cpu[0] if None not in cpu else None
    roles = {}
    for who in pids:
        a, b = go_mark["roles"].get(who), marks[-1]["roles"].get(who)
        roles[who] = None if a is None or b is None else b - a
    trial_cpu = [roles[t] for t in trials]
    elsewhere = None
    if cpu_s is not None and busy_go is not None and busy_end is not None:
        elsewhere = max(0.0, (busy_end - busy_go) - cpu_s) / (t_measured - t_go)
    out.update({
        "failed": False, "window_s": window, "samples": samples, "samples_per_s": samples / window,
        "epoch_samples_per_s": [k * n / (bounds[e + 1] - bounds[e]) for e in range(epochs)],
        "epoch_s": [bounds[e + 1] - bounds[e] for e in range(epochs)],
        "epoch_cpu_ms_per_sample": [1e3 * (cpu[e + 1] - cpu[e]) / (k * n) if None not in
                                    (cpu[e], cpu[e + 1]) else None for e in range(epochs)],
        "epoch_roles_cpu_ms_per_sample": [roles_between(a, b, pids, k * n)
                                          for a, b in zip([go_mark] + marks, marks)],
        # epoch 1 from the last trial's first batch (the start's latency left out)
        "epoch1_after_first_batch_samples_per_s": (
            k * (n - cfg["batch_size"]) / (ends[0] - max(r["epochs"][0]["t_first"] for r in res))
            if n > cfg["batch_size"] else None),
        "per_trial_samples_per_s": [sum(e["samples"] for e in r["epochs"])
                                    / (r["epochs"][-1]["t_end"] - t_go) for r in res],
        "first_batch_s": [r["epochs"][0]["t_first"] - t_go for r in res],
        "cpu_s": cpu_s, "cpu_ms_per_sample": 1e3 * cpu_s / samples if cpu_s else None,
        "cpus_busy": cpu_s / window if cpu_s else None,
        "trials_cpu_ms_per_sample": (1e3 * sum(trial_cpu) / samples
                                     if None not in trial_cpu else None),
        "producer_cpu_ms_per_sample": (1e3 * roles["producer"] / samples
                                       if roles.get("producer") is not None else None),
        "cpus_busy_elsewhere": elsewhere, "loadavg_after": os.getloadavg()[0],
        "exact": all(r["exact"] for r in res),
    })
    prints = [r["fingerprints"] for r in res]  # [trial][epoch] {index: fingerprint}
    out["same_as_trial0"] = [aug.same_share(p[e], prints[0][e])
                             for p in prints[1:] for e in range(epochs)]
    out["_fingerprints"] = prints  # dropped before writing
    if producer is not None and producer.get("marks"):
        # the producer's own CPU (and its loader workers') per dataset sample in each epoch
        # (from the beginning of each epoch to the next one's, the last to when it had
        # served everything; less the CPU of noting its memory as the last one began)
        pm = {m["epoch"]: m["cpu_s"] for m in producer["marks"]}
        served = (producer.get("served") or {}).get("cpu_s", producer.get("cpu_done_s"))
        edges = [pm.get(e) for e in range(epochs)] + [
            None if served is None else served - (producer.get("memory_cpu_s") or 0.0)]
        out["producer_epoch_cpu_ms_per_sample"] = [
            1e3 * (edges[e + 1] - edges[e]) / n if None not in (edges[e], edges[e + 1]) else None
            for e in range(epochs)]
        if epochs >= 2 and None not in (edges[1], edges[-1]):
            out["producer_cpu_ms_per_sample_later"] = 1e3 * (edges[-1] - edges[1]) / (n * (epochs - 1))
    if not out["exact"]:
        out["errors"].append("MISMATCH: " + "; ".join(
            f"{r['who']} epoch {i}: received {e['samples']} of {n} ({e['distinct']} distinct, "
            f"{e['duplicated']} duplicated, {e['missing']} missing)"
            for r in res for i, e in enumerate(r["epochs"]) if not e["exact"]))
    check_cache(out, cfg)
    return out


def check_cache(res: dict, cfg: dict) -> None:
    """That the producer's cache did what the system says (else an error)."""
    system = res["system"]
    stats = (res.get("producer") or {}).get("stats") or {}
    batches = math.ceil(cfg["images"] / cfg["batch_size"])
    want = {"batchcast-cache": (cfg["epochs"] - 1) * batches,
            "batchcast-warm": cfg["epochs"] * batches}.get(system)
    if want is None:
        return
    problems = []
    if stats.get("cache") != "ready":
        problems.append(f"cache {stats.get('cache')!r} ({stats.get('cache_off_because')})")
    if stats.get("cache_batches") != want:
        problems.append(f"{stats.get('cache_batches')} batches from the cache, not {want}")
    if stats.get("cache_batches_remade"):
        problems.append(f"{stats['cache_batches_remade']} batches remade")
    if stats.get("cache_samples") != cfg["images"]:
        problems.append(f"{stats.get('cache_samples')} samples kept, not {cfg['images']}")
    if (system == "batchcast-warm") != bool(stats.get("cache_warm")):
        problems.append(f"cache_warm {stats.get('cache_warm')}")
    if problems:
        res["errors"].append("CACHE NOT AS EXPECTED: " + ", ".join(problems))


def check_against_dataloader(res: dict, reference: list | None) -> None:
    """Each trial's images, epoch by epoch, against the DataLoader run's of
    the same K and repeat: the same augmentation of the same decoded sample."""
    prints = res.pop("_fingerprints", None)
    if res["failed"] or prints is None or reference is None or res["system"] == "dataloader":
        return
    shares = [aug.same_share(p[e], ref[e]) for p, ref in zip(prints, reference)
              for e in range(len(p))]
    res["same_as_dataloader"] = shares
    if min(shares) < 1:
        res["errors"].append(f"AUGMENTATION MISMATCH: as few as {min(shares):.1%} of a trial's "
                             "images of an epoch were the DataLoader trial's")


def disk_cache_file(cfg: dict) -> Path:
    return Path(cfg["cache_dir"]) / f"{cfg['warm_name']}.batchcast-cache"


def drop_file_pages(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


# ---- the report ---------------------------------------------------------------------------
def costs_of(costs: dict) -> tuple[float, float]:
    """(D, A') in seconds: D with its uint8 collate, A' = A + its float collate."""
    return costs["D"] + costs["C8"], costs["A"] + costs["C"]


def ideal(costs: dict, system: str, k: int, e: int) -> float:
    """CPU seconds per sample received."""
    d, a = costs_of(costs)
    return {"dataloader": d + a, "dataloader-cached": d / e + a, "batchcast": d / k + a,
            "batchcast-cache": d / (e * k) + a, "batchcast-warm": a}[system]


def speedup_bounds(costs: dict, k: int, e: int) -> dict:
    d, a = costs_of(costs)
    return {"over_dataloader": k * (d + a) / (d / e + k * a),
            "over_batchcast": (d + k * a) / (d / e + k * a),
            "over_dataloader_cached": k * (d / e + a) / (d / e + k * a)}


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f}"


def memory_summary(r: dict) -> dict:
    rows = r.get("memory") or []

    def total(pred, key):
        return sum(x[key] for x in rows if pred(x["who"]))

    out = {key: total(lambda w: True, key) for key in ("pss", "decoded_pss", "decoded_rss",
                                                         "ring_pss")}
    for role, pred in (("producer", lambda w: w.startswith("producer")),
                       ("trials", lambda w: w.startswith("trial") and not w.endswith("-worker")),
                       ("workers", lambda w: w.startswith("trial") and w.endswith("-worker"))):
        for key in ("rss", "shared", "uss", "pss"):
            out[f"{role}_{key}"] = total(pred, key)
    out["processes"] = len(rows)
    return out


def med(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def markdown(doc: dict) -> str:
    env, cfg, costs = doc["env"], doc["config"], doc["costs"]
    cpus, e, n = env["cpus_used"], cfg["epochs"], cfg["images"]
    d, a = costs_of(costs)
    copy = n * ROW_BYTES
    ms = lambda s: f"{1e3 * s:.2f}"  # noqa: E731
    by: dict = {}
    for r in doc["runs"]:
        by.setdefault((r["k"], r["system"]), []).append(r)

    def ok(k, system):
        return [r for r in by.get((k, system), []) if not r["failed"]]

    def rate(k, system):
        return med([r["samples_per_s"] for r in ok(k, system)])

    lines = [
        "# Decode once per sweep: the producer's decoded cache against per-trial caches",
        "",
        f"{env['date']}, {env['cpu']}, {cpus} CPUs, Python {env['python']}, torch "
        f"{env['torch']}, batchcast {env['batchcast']} (git {env['git']}).",
        "",
        f"    {doc['command']}",
        "",
        f"K trials × E = {e} epochs of {n:,} samples (sample i decodes file i % {cfg['files']}: "
        f"photo-like JPEGs of 500x375, {costs['file_kb']:.0f} KB on average), batch "
        f"{cfg['batch_size']}; trial k: colour jitter 0.1 + 0.1 k, seed 1000 + k, each sample's "
        f"augmentation seeded by (seed, epoch, index). DataLoader per trial: "
        f"{cfg['workers_note']} persistent workers; producer's DataLoader: "
        f"{cfg['producer_workers']} workers; consumers: bc.Augment with {cfg['threads_note']} "
        f"threads. {cfg['repeats']} repeat(s), systems alternated; cells are median [min, max]. "
        "dataloader-cached: each trial's dataset keeps its decoded samples in shared memory that "
        "its loader workers fill in epoch 1 and read later (one copy per trial, as Ultralytics' "
        "cache=ram). batchcast-warm: a producer of one name whose disk cache "
        + (f"({mib(doc['build']['file_bytes'])} MiB) " if (doc.get("build") or {}).get("file_bytes")
           else "") + "a first sweep made before the runs" + (" (its pages dropped from the page cache before each run)" if cfg["cold_file"]
                  else " (in the page cache, as the first sweep left it)") + ".",
        "",
        f"Measured alone (one thread, CPU per sample): **D = {ms(d)} ms** (decode + resize "
        f"{ms(costs['D'])}, uint8 collate {ms(costs['C8'])}), **A' = {ms(a)} ms** (augment "
        f"{ms(costs['A'])}, float collate {ms(costs['C'])}). CPU per sample received, ideally: "
        f"dataloader D + A', dataloader-cached D/E + A', batchcast D/K + A', batchcast-cache "
        f"D/(EK) + A', batchcast-warm A'; the physical bound on {cpus} CPUs is P / that.",
        "",
    ]
    for note in doc.get("notes", []):
        lines += [f"**Note:** {note}", ""]
    other = [r["cpus_busy_elsewhere"] for r in doc["runs"]
             if r.get("cpus_busy_elsewhere") is not None]
    if other and max(other) > 0.2:
        lines += [f"**The machine was not quiet:** other work kept up to {max(other):.2f} CPUs "
                  f"busy during some runs (median {statistics.median(other):.2f}); the rates are "
                  "low and noisy against the bounds. Rerun on a quiet machine.", ""]

    # -- the targets
    lines += ["## Speed-up against the bounds (target ≥ 90% of both at every K)", "",
              "| K | bound K(D+A')/(D/E+KA') | batchcast-cache / dataloader | % of bound | "
              "bound (D+KA')/(D/E+KA') | batchcast-cache / batchcast | % of bound | "
              "bound K(D/E+A')/(D/E+KA') | batchcast-cache / dataloader-cached | % of bound | "
              "target |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    missed: list[tuple[int, str]] = []
    for k in cfg["ks"]:
        b = speedup_bounds(costs, k, e)
        top = rate(k, "batchcast-cache")
        cells, shares = [], []
        for base, key in (("dataloader", "over_dataloader"), ("batchcast", "over_batchcast"),
                          ("dataloader-cached", "over_dataloader_cached")):
            low = rate(k, base)
            if top and low:
                got = top / low
                cells += [f"{b[key]:.2f}x", f"{got:.2f}x", f"{got / b[key]:.0%}"]
                if key != "over_dataloader_cached":
                    shares.append(got / b[key])
            else:
                cells += [f"{b[key]:.2f}x", "–", "–"]
        verdict = "–"
        if len(shares) == 2:
            verdict = "met" if min(shares) >= 0.9 else "**missed**"
            if min(shares) < 0.9:
                missed.append((k, "speed-up"))
        lines.append(f"| {k} | " + " | ".join(cells) + f" | {verdict} |")

    # -- every system
    lines += ["", "## Every system", "",
              "| K | system | samples/s, all trials | physical bound | share | samples/s per "
              "epoch (1, 2, …) | CPU ms per sample (ideal) | CPUs busy | producer CPU ms per "
              "dataset sample, epochs ≥ 2 | cache | each sample once | augmentations | other work, CPUs |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for k in cfg["ks"]:
        for system in cfg["systems"]:
            runs = by.get((k, system), [])
            bound = cpus / ideal(costs, system, k, e)
            if system in doc.get("skipped", {}):
                lines.append(f"| {k} | {system} | skipped: {doc['skipped'][system]} | "
                             f"{bound:,.0f} | | | | | | | | | |")
                continue
            good = [r for r in runs if not r["failed"]]
            failed = len(runs) - len(good)
            rates = [r["samples_per_s"] for r in good]
            share = f"{statistics.median(rates) / bound:.0%}" if rates else "–"
            per_epoch = ", ".join(f"{med([r['epoch_samples_per_s'][i] for r in good]):,.0f}"
                                  for i in range(e)) if good else "–"
            cpu = [r["cpu_ms_per_sample"] for r in good]
            busy = [r["cpus_busy"] for r in good]
            later = [r.get("producer_cpu_ms_per_sample_later") for r in good]
            later = [v for v in later if v is not None]
            stats = [(r.get("producer") or {}).get("stats") or {} for r in good]
            cache = "–"
            if stats and stats[0].get("cache"):
                s = stats[-1]
                cache = (f"{s['cache']}, {mib(s['cache_bytes'])} MiB, {s['cache_samples']:,} "
                         f"samples, {s['cache_batches']} batches"
                         + (", warm" if s.get("cache_warm") else ""))
            elif system == "dataloader-cached":
                cache = f"{k} × {mib(copy)} MiB (per trial)"
            once = "yes" if good and all(r["exact"] for r in good) else "**NO**" if good else "–"
            note = f" ({failed} of {len(runs)} runs failed)" if failed else ""
            lines.append(
                f"| {k} | {system}{note} | {aug.med_range(rates)} | {bound:,.0f} | {share} | "
                f"{per_epoch} | {aug.med_range(cpu, '{:.2f}')} ({ms(ideal(costs, system, k, e))}) "
                f"| {aug.med_range(busy, '{:.2f}')} | {aug.med_range(later, '{:.3f}')} | {cache} "
                f"| {once} | {aug.augmentation_cell(good)} | "
                f"{aug.med_range([r['cpus_busy_elsewhere'] for r in good if r.get('cpus_busy_elsewhere') is not None], '{:.2f}')} |")

    # -- the warm sweep
    if "batchcast-warm" in cfg["systems"] and "batchcast-warm" not in doc.get("skipped", {}):
        build = doc.get("build") or {}
        lines += ["", "## The second sweep, on a warm disk cache (target: its first epoch as fast "
                  "as its later ones)", ""]
        if build.get("samples_per_s"):
            lines += [f"The first sweep (one epoch, one trial, cache=\"disk\") made the file in "
                      f"{build['window_s']:.1f} s ({build['samples_per_s']:,.0f} samples/s), "
                      f"{mib(build['file_bytes'])} MiB.", ""]
        lines += ["| K | warm: epoch 1 samples/s | warm: epochs ≥ 2 samples/s | epoch 1 / later | "
                  "first batch s | epoch 1 after its first batch / later | CPU ms/sample, epoch 1 "
                  "/ later (producer, trials) | batchcast-cache: epoch 1 / later | target |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for k in cfg["ks"]:
            cells = []
            ratio_warm = None
            for system in ("batchcast-warm", "batchcast-cache"):
                good = [r for r in ok(k, system) if e > 1]
                first = [r["epoch_samples_per_s"][0] for r in good]
                rest = [statistics.median(r["epoch_samples_per_s"][1:]) for r in good]
                ratios = [f / l for f, l in zip(first, rest)]
                if system == "batchcast-warm":
                    ratio_warm = med(ratios)
                    after = [r["epoch1_after_first_batch_samples_per_s"] / l
                             for r, l in zip(good, rest)
                             if r.get("epoch1_after_first_batch_samples_per_s")]
                    roles = [r["epoch_roles_cpu_ms_per_sample"] for r in good]

                    def cpu_cell(role):
                        one = med([x[0].get(role) for x in roles])
                        later = med([statistics.median(y.get(role, 0) for y in x[1:])
                                     for x in roles])
                        return "–" if one is None or later is None else f"{one:.2f} / {later:.2f}"

                    cells += [aug.med_range(first), aug.med_range(rest),
                              aug.med_range(ratios, "{:.2f}"),
                              aug.med_range([max(r["first_batch_s"]) for r in good], "{:.2f}"),
                              aug.med_range(after, "{:.2f}"),
                              f"{cpu_cell('producer')}, {cpu_cell('trials')}"]
                else:
                    cells.append(aug.med_range(ratios, "{:.2f}"))
            verdict = "–" if ratio_warm is None else "met" if ratio_warm >= 0.9 else "**missed**"
            if ratio_warm is not None and ratio_warm < 0.9:
                missed.append((k, "warm"))
            lines.append(f"| {k} | " + " | ".join(cells) + f" | {verdict} |")

    # -- memory
    lines += ["", "## Memory (target: one decoded copy whatever K)", "",
              f"One decoded copy: {n:,} × 3×256×256 bytes = {mib(copy)} MiB. Memory of every "
              "process (psutil memory_full_info, MiB, median over the repeats): the trials and "
              "their loader workers when every trial has taken its last sample, the producer "
              "(with its loader's workers, uncached) as its last epoch begins. Decoded data: the "
              "pss of the mappings that hold the decoded samples (the producer's kept rows, the "
              "disk cache's file, a per-trial cache's shared memory, in every process that maps "
              "them); ring: batchcast's ring (its memfd), wherever mapped. Over uncached: the "
              "sweep's PSS − the same system's without a cache (same K), which also moves with "
              "loader workers and ring pages.", "",
              "| K | system | processes | PSS, all | decoded data PSS (copies) | ring PSS | "
              "PSS over uncached (copies) | producer RSS / shared / USS | trials RSS / shared / "
              "USS (sum) | trials' workers RSS / shared / USS (sum) | producer peak RSS |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for k in cfg["ks"]:
        for system in cfg["systems"]:
            good = ok(k, system)
            if not good:
                continue
            sums = [memory_summary(r) for r in good]
            m = {key: med([x[key] for x in sums]) for key in sums[0]}
            extra = "–"
            base = UNCACHED.get(system)
            if base and ok(k, base):
                over = m["pss"] - med([memory_summary(r)["pss"] for r in ok(k, base)])
                extra = f"{mib(over)} ({over / copy:.2f})"
            peak = med([(r.get("producer") or {}).get("maxrss") for r in good])

            def trio(role):
                if not m[f"{role}_rss"]:
                    return "–"
                return " / ".join(mib(m[f"{role}_{key}"]) for key in ("rss", "shared", "uss"))

            lines.append(f"| {k} | {system} | {m['processes']:.0f} | {mib(m['pss'])} | "
                         f"{mib(m['decoded_pss'])} ({m['decoded_pss'] / copy:.2f}) | "
                         f"{mib(m['ring_pss'])} | {extra} | {trio('producer')} | {trio('trials')} "
                         f"| {trio('workers')} | {mib(peak) if peak else '–'} |")

    # -- where the time goes
    lines += ["", "## Where the time goes", "",
              "CPU ms per sample received, by process (the producer with its loader workers; the "
              "trials with theirs), against the ideal; CPUs busy = the run's CPU / its time, of "
              f"{cpus}; idle = the share of the {cpus} CPUs the run left unused.", "",
              "| K | system | time s | CPUs busy | idle | CPU ms/sample: all (ideal) | producer "
              "(ideal) | trials (ideal) | CPU ms/sample per epoch: all (producer, trials) | "
              "producer CPU ms per dataset sample per epoch |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for k in cfg["ks"]:
        for system in cfg["systems"]:
            good = ok(k, system)
            if not good:
                continue
            busy = med([r["cpus_busy"] for r in good])
            prod = med([r.get("producer_cpu_ms_per_sample") for r in good])
            pideal = {"batchcast": d / k, "batchcast-cache": d / (e * k),
                      "batchcast-warm": 0.0}.get(system)
            tideal = a if system in BATCHCAST else ideal(costs, system, k, e)
            cells = []
            for i in range(e):
                parts = [med([r["epoch_roles_cpu_ms_per_sample"][i].get(role) for r in good])
                         for role in ("producer", "trials")]
                inner = ", ".join(f"{x:.2f}" for x in parts if x is not None)
                cells.append(f"{med([r['epoch_cpu_ms_per_sample'][i] for r in good]):.2f}"
                             + (f" ({inner})" if inner else ""))
            per_epoch = "; ".join(cells)
            pe = [r.get("producer_epoch_cpu_ms_per_sample") for r in good]
            pe = [x for x in pe if x]
            pcell = (", ".join(f"{med([x[i] for x in pe]):.3f}" for i in range(e)) if pe else "–")
            lines.append(
                f"| {k} | {system} | {med([r['window_s'] for r in good]):.1f} | "
                f"{busy:.2f} | {max(0.0, 1 - busy / cpus):.0%} | "
                f"{med([r['cpu_ms_per_sample'] for r in good]):.2f} "
                f"({ms(ideal(costs, system, k, e))}) | "
                + (f"{prod:.3f} ({ms(pideal)})" if prod is not None and pideal is not None else "–")
                + f" | {med([r['trials_cpu_ms_per_sample'] for r in good]):.2f} ({ms(tideal)}) | "
                f"{per_epoch} | {pcell} |")
    if missed:
        lines += ["", "Targets missed:", ""]
        for k, what in missed:
            lines.append(f"- K={k}, {what}: " + explain(by, k, what, costs, cpus, e))
    lines += [
        "",
        "- samples/s: samples all trials received / (the last trial's last sample − the common "
        "start); per epoch: K × N / (the last trial's end of that epoch − of the one before).",
        "- CPU: user + system of every process of the run (trials, producer, loader workers) from "
        "the start to the last trial's last sample, per sample received; per epoch, between the "
        "moments every trial had ended the epoch before and that one. The producer's own, per "
        "dataset sample, from its own epoch boundaries (noted in the producer, up to when it "
        "had served everything); the per-epoch split by process is between the trials' epoch "
        "ends, and the producer runs ahead of those by up to its ring's slots.",
        "- each sample once: every trial got every sample of every epoch exactly once; "
        "augmentations: \"= DataLoader's\" when every image of every epoch was the one the "
        "DataLoader run of that K and repeat gave the same trial (so the cached samples are the "
        "decoded ones, bit for bit); \"per trial\" when no trial's image matched trial 0's.",
        "- other work: the machine's busy CPU time over the run (/proc/stat) less the run's own, "
        "per second (0 on a quiet machine).",
    ]
    errors = [f"K={r['k']} {r['system']} #{r['repeat']}: {x}" for r in doc["runs"]
              for x in r["errors"]]
    if errors:
        lines += ["", "## Errors", ""] + [f"- {x.splitlines()[0]}" for x in errors]
    return "\n".join(lines) + "\n"


def explain(by: dict, k: int, what: str, costs: dict, cpus: int, e: int) -> str:
    """Where the time went, in words, for a target missed."""
    def good(system):
        return [r for r in by.get((k, system), []) if not r["failed"]]

    parts = []
    systems = (["batchcast-warm"] if what == "warm" else
               ["batchcast-cache", "dataloader", "batchcast"])
    for system in systems:
        runs = good(system)
        if not runs:
            continue
        rate = med([r["samples_per_s"] for r in runs])
        bound = cpus / ideal(costs, system, k, e)
        busy = med([r["cpus_busy"] for r in runs])
        cpu = med([r["cpu_ms_per_sample"] for r in runs])
        want = 1e3 * ideal(costs, system, k, e)
        text = (f"{system} at {rate / bound:.0%} of its bound: CPU {cpu:.2f} ms/sample against "
                f"{want:.2f} ({cpu / want - 1:+.0%}), {busy:.2f} of {cpus} CPUs busy")
        prod = med([r.get("producer_cpu_ms_per_sample") for r in runs])
        trials = med([r.get("trials_cpu_ms_per_sample") for r in runs])
        if trials is not None:
            text += f"; trials {trials:.2f} ms/sample (A' {1e3 * costs_of(costs)[1]:.2f})"
        if prod is not None:
            text += f", producer {prod:.3f}"
        if what == "warm":
            first = med([r["epoch_cpu_ms_per_sample"][0] for r in runs])
            later = med([statistics.median(r["epoch_cpu_ms_per_sample"][1:]) for r in runs])
            text += (f"; epoch 1 {first:.2f} CPU ms/sample against {later:.2f} later")
            for role in ("producer", "trials"):
                one = med([r["epoch_roles_cpu_ms_per_sample"][0].get(role) for r in runs])
                rest = med([statistics.median(x.get(role, 0) for x in
                                              r["epoch_roles_cpu_ms_per_sample"][1:])
                            for r in runs])
                if one is not None and rest is not None:
                    text += f" ({role} {one:.2f} against {rest:.2f})"
            after = med([r.get("epoch1_after_first_batch_samples_per_s") for r in runs])
            text += (f"; the first batch after {med([max(r['first_batch_s']) for r in runs]):.2f} s"
                     + (f", epoch 1 from it {after:,.0f} samples/s" if after else ""))
        other = med([r.get("cpus_busy_elsewhere") for r in runs])
        if other:
            text += f"; other work {other:.2f} CPUs"
        parts.append(text)
    return "; ".join(parts) or "no runs to tell"


def one_line(r: dict) -> str:
    if r["failed"]:
        return (f"K={r['k']} {r['system']:<18} FAILED: "
                + " | ".join(x.splitlines()[0] for x in r["errors"]))
    stats = (r.get("producer") or {}).get("stats") or {}
    later = r.get("producer_cpu_ms_per_sample_later")
    return (f"K={r['k']} {r['system']:<18} {r['samples_per_s']:7.1f} samples/s in "
            f"{r['window_s']:5.1f} s (epochs: "
            + ", ".join(f"{x:.0f}" for x in r["epoch_samples_per_s"])
            + f"), CPU {r['cpu_ms_per_sample']:.2f} ms/sample, busy {r['cpus_busy']:.2f}"
            + (f", producer {later:.3f} ms/sample in epochs >= 2" if later is not None else "")
            + (f", cache {stats['cache']} {mib(stats['cache_bytes'])} MiB" if stats.get("cache")
               else "")
            + f", PSS {mib(memory_summary(r)['pss'])} MiB, "
            + ("exact" if r["exact"] else "NOT EXACT")
            + (f", DataLoader's images: {min(r['same_as_dataloader']):.0%}"
               if r.get("same_as_dataloader") else "")
            + (f", other work {r['cpus_busy_elsewhere']:.2f} CPUs"
               if r.get("cpus_busy_elsewhere") is not None else "")
            + "".join(f"; {x.splitlines()[0]}" for x in r["errors"]))


def batchcast_missing() -> dict[str, str]:
    """The batchcast systems the installed batchcast cannot run, and why."""
    why = aug.per_trial_missing()
    if why:
        return {s: why for s in BATCHCAST}
    import batchcast as bc

    if "cache" not in inspect.signature(bc.Producer.__init__).parameters or \
            not hasattr(bc, "Cache"):
        return {s: f"batchcast {getattr(bc, '__version__', '?')} at {Path(bc.__file__).parent} "
                   "has no Producer(cache=)" for s in ("batchcast-cache", "batchcast-warm")}
    return {}


# ---- main ---------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", type=int, nargs="+", default=None, help="trial counts (default 1 2 4 8)")
    ap.add_argument("--epochs", type=int, default=4, help="epochs of every sweep (E)")
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS, default=SYSTEMS)
    ap.add_argument("--images", type=int, default=4096, help="samples per epoch (N)")
    ap.add_argument("--files", type=int, default=512,
                    help="distinct JPEG files (sample i decodes file i %% files)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=None,
                    help="workers of each trial's own DataLoader (default max(1, CPUs // K))")
    ap.add_argument("--producer-workers", type=int, default=None,
                    help="workers of the producer's DataLoader (default: the CPUs)")
    ap.add_argument("--threads", type=int, default=None,
                    help="bc.Augment threads of each consumer (default max(1, CPUs // K))")
    ap.add_argument("--slots", type=int, default=8, help="the producer's ring slots")
    ap.add_argument("--cold-file", action="store_true",
                    help="drop the disk cache file's pages from the page cache before each "
                         "batchcast-warm run (default: as the first sweep left them)")
    ap.add_argument("--timeout", type=float, default=120.0, help="consumers' timeout")
    ap.add_argument("--run-timeout", type=float, default=900.0, help="seconds one run may take")
    ap.add_argument("--measure-samples", type=int, default=128)
    ap.add_argument("--measure-passes", type=int, default=5)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: K = 1 2, 2 epochs, 384 images, 1 repeat, into "
                         "benchmarks/.cache/quick/")
    ap.add_argument("--out", default=None,
                    help="markdown file (default benchmarks/results/cache.md); the JSON beside it")
    args = ap.parse_args()
    if args.quick:
        args.ks = args.ks or [1, 2]
        args.epochs, args.images, args.files, args.repeats = 2, 384, 64, 1
        args.batch_size, args.measure_samples, args.measure_passes = 32, 32, 3
        args.run_timeout = min(args.run_timeout, 120.0)
    args.ks = args.ks or [1, 2, 4, 8]
    if args.epochs < 1:
        sys.exit("--epochs must be >= 1")
    out = Path(args.out) if args.out else (
        HERE / ".cache" / "quick" / "cache.md" if args.quick else HERE / "results" / "cache.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out_json = out.with_suffix(".json")
    try:
        import PIL  # noqa: F401
        import psutil  # noqa: F401
    except ImportError as exc:
        sys.exit(f"cache.py needs Pillow and psutil: {exc}")
    import _augment_ops as ops

    cpus = len(os.sched_getaffinity(0))
    folder = ops.ensure_photos(HERE / ".cache", args.files)
    tmp = tempfile.mkdtemp(prefix="cache-bench-")
    cfg = {"folder": str(folder), "images": args.images, "files": args.files,
           "batch_size": args.batch_size, "slots": args.slots, "step_ms": 0.0,
           "timeout": args.timeout, "run_timeout": args.run_timeout, "epochs": args.epochs,
           "producer_workers": args.producer_workers if args.producer_workers is not None
           else cpus, "cache_dir": os.path.join(tmp, "disk-cache"),
           "warm_name": f"cache-bench-warm-{os.getpid()}",
           "measure_samples": args.measure_samples, "measure_passes": args.measure_passes}
    config = {**vars(args), "out": str(out), "folder": str(folder),
              "producer_workers": cfg["producer_workers"],
              "workers_note": str(args.workers) if args.workers is not None else f"max(1, {cpus} // K)",
              "threads_note": str(args.threads) if args.threads is not None else f"max(1, {cpus} // K)"}
    env = aug.environment(args)
    python_path = os.environ.get("PYTHONPATH")
    command = ((f"PYTHONPATH={python_path} " if python_path else "")
               + " ".join(["python", "benchmarks/cache.py", *sys.argv[1:]]))
    skipped = {s: why for s, why in batchcast_missing().items() if s in args.systems}
    for s, why in skipped.items():
        print(f"{s}: {why}; skipped", flush=True)

    print("measuring D (decode + resize) and A' (augmentation + collate), one thread ...",
          flush=True)
    measured = subprocess.run([sys.executable, aug.__file__, "--measure", json.dumps(cfg)],
                              check=False, capture_output=True, text=True)
    if measured.returncode != 0:
        sys.exit(f"measuring failed:\n{measured.stderr}")
    costs = json.loads(measured.stdout.strip().splitlines()[-1])
    d, a = costs_of(costs)
    print(f"D = {1e3 * d:.2f} ms, A' = {1e3 * a:.2f} ms per sample (CPU, one thread)", flush=True)
    for k in args.ks:
        b = speedup_bounds(costs, k, args.epochs)
        print(f"K={k}: bounds: batchcast-cache over dataloader {b['over_dataloader']:.2f}x, over "
              f"batchcast {b['over_batchcast']:.2f}x; samples/s: "
              + ", ".join(f"{s} {cpus / ideal(costs, s, k, args.epochs):,.0f}" for s in SYSTEMS),
              flush=True)

    aug.set_subreaper()
    os.environ.setdefault("BATCHCAST_RUNTIME_DIR", os.path.join(tmp, "runtime"))
    doc: dict[str, Any] = {"env": env, "command": command, "config": config, "costs": costs,
                           "skipped": skipped, "notes": [], "runs": [],
                           "bounds": {k: speedup_bounds(costs, k, args.epochs) for k in args.ks}}
    started = time.monotonic()
    try:
        if "batchcast-warm" in args.systems and "batchcast-warm" not in skipped:
            # the first sweep: one epoch, one trial, makes the disk cache's file
            print("the first sweep: making the disk cache ...", flush=True)
            build = run("batchcast-warm-build", 1, {**cfg, "epochs": 1, "workers": cpus,
                                                    "threads": cpus}, 0, name=cfg["warm_name"])
            build.pop("_fingerprints", None)
            path = disk_cache_file(cfg)
            build["file_bytes"] = path.stat().st_size if path.exists() else None
            doc["build"] = build
            if build["failed"] or not path.exists():
                skipped["batchcast-warm"] = ("the first sweep did not make the file: "
                                             + "; ".join(x.splitlines()[0] for x in build["errors"]))
                print(f"batchcast-warm: {skipped['batchcast-warm']}; skipped", flush=True)
            else:
                print(f"made {path} ({mib(build['file_bytes'])} MiB) in {build['window_s']:.1f} s",
                      flush=True)
        systems = [s for s in args.systems if s not in skipped]
        total = len(args.ks) * args.repeats * len(systems)
        for k in args.ks:
            cfg["workers"] = args.workers if args.workers is not None else max(1, cpus // k)
            cfg["threads"] = args.threads if args.threads is not None else max(1, cpus // k)
            for r in range(args.repeats):
                reference = None  # the DataLoader run's images of this K and repeat
                for system in systems:
                    if system == "batchcast-warm" and args.cold_file:
                        drop_file_pages(disk_cache_file(cfg))
                    res = run(system, k, cfg, r,
                              name=cfg["warm_name"] if system == "batchcast-warm" else None)
                    if system == "dataloader":
                        reference = None if res["failed"] else res.get("_fingerprints")
                    check_against_dataloader(res, reference)
                    res.pop("_fingerprints", None)
                    res["workers"] = cfg["workers"] if system.startswith("dataloader") else None
                    res["threads"] = cfg["threads"] if system in BATCHCAST else None
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
    print(f"written: {out}, {out_json} ({doc['elapsed_s']:.0f} s)")
    bad = [r for r in doc["runs"] if r["failed"] or not r.get("exact") or r["errors"]]
    if bad:
        sys.exit(f"{len(bad)} run(s) failed or did not deliver every sample exactly once: "
                 + "; ".join(f"K={r['k']} {r['system']} #{r['repeat']}: "
                             + (r["errors"][0].splitlines()[0] if r["errors"] else "not exact")
                             for r in bad))


if __name__ == "__main__":
    main()

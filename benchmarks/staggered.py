"""A staggered hyperparameter sweep (ASHA-like): trials arrive one after
another while earlier ones train, some are pruned early; one shared producer
(two ways of joining it) against a DataLoader per trial.

    python benchmarks/staggered.py            # 6 trials, 3 repeats (~10 min on 2 CPUs)
    python benchmarks/staggered.py --gap 0 --modes now --stem aligned   # the trials aligned
    python benchmarks/staggered.py --quick    # smoke run (< 1 min), writes to benchmarks/.cache/
    python benchmarks/staggered.py --trials 12 --gap 1 --repeats 5 --modes dataloader now

Trial i is its own process (multiprocessing, spawn), started --gap seconds
after trial i-1. It trains for its own epochs (drawn from --epochs-per-trial
with --seed; batch size 32 / 64 / 48 / 100 in turn): it reads every batch once
(a copy into a buffer kept across steps, as a host-to-device copy would), then
sleeps the rest of a --step-ms step. Every --prune-every-th trial is pruned:
it stops --prune-at of the way through its last epoch. The plan is the same
for every mode and repeat. The loader is batchcast's synthetic image pipeline
(decode-like CPU work per sample) returning (image, index), batch 64,
shuffled with a seeded generator, --workers workers.

Modes (alternated A B C A B C over --repeats):

  dataloader  every trial builds its own DataLoader with those settings
  next_epoch  one producer process, bc.Producer(loader, name, epochs=None),
              serving until stopped; each trial is bc.Consumer(name,
              batch_size=b, late_join="next_epoch"): it starts at the
              producer's next epoch
  now         the same with late_join="now": it starts with the next batch
              published; its epochs are the next samples_per_epoch samples
              it receives (skipped, with a note, where the installed
              batchcast refuses it)

Reported per mode (median [min, max] over the repeats): each trial's time to
construct its Consumer / DataLoader (connect) and from there to its first
batch (also from its spawn), mean and max over the trials; the makespan (first
trial's spawn to the last trial's end); CPU seconds of every process
(getrusage(RUSAGE_CHILDREN) in this driver, which reaps them all), of the
trials, and of loading (the trials' loader workers, or the producer process
and its workers) per sample the trials used; samples loaded (the dataset's
__getitem__ calls, counted in shared memory) against samples used; and
exactness: every complete epoch of every trial holds each sample index once
(a pruned trial's last, partial epoch is not checked). Loader workers are
forked, as in a trial started on its own on Linux. Results:
benchmarks/results/STEM.{md,json}, STEM staggered by default (--quick:
benchmarks/.cache/).
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import queue
import random
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

import batchcast as bc
from batchcast.synthetic import SyntheticImages

HERE = Path(__file__).resolve().parent
BATCH_SIZES = [32, 64, 48, 100]
MODES = ("dataloader", "next_epoch", "now")
FORK = mp.get_context("fork")
# time.monotonic() is CLOCK_MONOTONIC, one clock for every process of this machine.


@dataclass(frozen=True)
class Config:
    samples: int
    size: int
    workers: int
    seed: int
    step_ms: float
    timeout: float


@dataclass(frozen=True)
class TrialSpec:
    index: int
    batch_size: int
    epochs: int
    stop_after: int | None  # pruned: samples of its last epoch after which it stops


class Indexed(Dataset[tuple[torch.Tensor, int]]):
    """SyntheticImages' sample i as (image, i); counts every sample loaded in
    `loads`, shared with the loader's (forked) workers."""

    def __init__(self, samples: int, size: int, loads: Any) -> None:
        self.images = SyntheticImages(samples, size=size)
        self.loads = loads

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image, _label, index = self.images[i]
        with self.loads.get_lock():
            self.loads.value += 1
        return image, index


def make_loader(cfg: Config, batch_size: int, loads: Any) -> DataLoader[Any]:
    # fork, as for a trial started on its own on Linux: in a process started by spawn, the
    # default is spawn, and every worker would import torch again each epoch.
    return DataLoader(Indexed(cfg.samples, cfg.size, loads), batch_size=batch_size, shuffle=True,
                      num_workers=cfg.workers, generator=torch.Generator().manual_seed(cfg.seed),
                      multiprocessing_context="fork" if cfg.workers else None)


def cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def train(mode: str, spec: TrialSpec, cfg: Config, name: str) -> dict[str, Any]:
    torch.set_num_threads(1)
    loads = FORK.Value("q", 0)  # inherited by the DataLoader's (forked) workers
    t_construct = time.monotonic()
    if mode == "dataloader":
        loader: Any = make_loader(cfg, spec.batch_size, loads)
    else:
        loader = bc.Consumer(name, batch_size=spec.batch_size, timeout=cfg.timeout, join=mode)
    t_connected = time.monotonic()
    t_first: float | None = None
    buffer: torch.Tensor | None = None
    step = cfg.step_ms / 1e3
    used = complete = exact = missing = duplicated = 0
    for epoch in range(spec.epochs):
        limit = spec.stop_after if epoch == spec.epochs - 1 else None
        seen: list[int] = []
        for images, index in loader:
            if t_first is None:
                t_first = time.monotonic()
            r = time.perf_counter()
            if buffer is None or buffer.shape[0] < len(images):
                buffer = torch.empty_like(images)
            buffer[:len(images)].copy_(images)  # the trainer reads its batch once
            seen += index.tolist()
            r = time.perf_counter() - r
            if step > r:
                time.sleep(step - r)  # the emulated step
            if limit is not None and len(seen) >= limit:
                break  # pruned: a partial epoch, not checked
        used += len(seen)
        if limit is not None:
            break
        complete += 1
        distinct = set(seen)
        exact += sorted(seen) == list(range(cfg.samples))
        missing += cfg.samples - len(distinct & set(range(cfg.samples)))
        duplicated += len(seen) - len(distinct)
    if mode == "dataloader":
        del loader  # its workers were joined when its iterators went
    else:
        loader.close()
    return {"t_construct": t_construct, "t_connected": t_connected, "t_first": t_first,
            "t_end": time.monotonic(), "samples": used, "epochs_complete": complete,
            "epochs_exact": exact, "missing": missing, "duplicated": duplicated,
            "loads": loads.value if mode == "dataloader" else None}


def trial_main(mode: str, spec: TrialSpec, cfg: Config, name: str, t_spawn: float,
               results: Any) -> None:
    out: dict[str, Any] = {"who": f"trial-{spec.index}", **asdict(spec), "t_spawn": t_spawn,
                           "t_entry": time.monotonic(), "error": None}
    try:
        out.update(train(mode, spec, cfg, name))
    except Exception as exc:  # reported, not hidden: the run is marked failed
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["own_cpu"] = cpu(resource.RUSAGE_SELF)
    out["workers_cpu"] = cpu(resource.RUSAGE_CHILDREN)  # its DataLoader workers, all joined
    results.put(out)


def producer_main(cfg: Config, name: str, ready: Any, stop: Any, results: Any) -> None:
    torch.set_num_threads(1)
    loads = FORK.Value("q", 0)
    producer = bc.Producer(make_loader(cfg, 64, loads), name, epochs=None).start()
    cpu0 = cpu(resource.RUSAGE_SELF) + cpu(resource.RUSAGE_CHILDREN)
    ready.set()
    stop.wait()
    error = None
    try:
        producer.stop()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    stats = producer.stats()
    results.put({"who": "producer", "error": error, "loads": loads.value,
                 "loading_cpu": cpu(resource.RUSAGE_SELF) + cpu(resource.RUSAGE_CHILDREN) - cpu0,
                 "stats": {k: v for k, v in stats.items() if k != "consumers"}})


def collect(results: Any, procs: list[Any], deadline: float) -> dict[str, dict[str, Any]]:
    """Every process's result; one that exited without one (or the deadline) is an error."""
    got: dict[str, dict[str, Any]] = {}
    while len(got) < len(procs):
        try:
            item = results.get(timeout=0.5)  # wakes on a result; the timeout re-checks liveness
            got[item["who"]] = item
            continue
        except queue.Empty:
            pass
        lost = [p for p in procs if p.name not in got and p.exitcode is not None]
        if lost or time.monotonic() > deadline:
            while True:  # what they put before exiting is in the pipe already
                try:
                    item = results.get_nowait()
                    got[item["who"]] = item
                except queue.Empty:
                    break
            for p in procs:
                if p.name not in got and (p.exitcode is not None or time.monotonic() > deadline):
                    p.kill()
                    got[p.name] = {"who": p.name, "error": f"no result (exit code {p.exitcode})"}
    return got


def run(ctx: Any, mode: str, plan: list[TrialSpec], cfg: Config, gap: float, name: str,
        run_timeout: float) -> dict[str, Any]:
    results = ctx.Queue()
    cpu0 = cpu(resource.RUSAGE_CHILDREN)
    deadline = time.monotonic() + run_timeout
    producer, stop = None, None
    out: dict[str, Any] = {"mode": mode, "errors": []}
    if mode != "dataloader":
        ready, stop = ctx.Event(), ctx.Event()
        producer = ctx.Process(target=producer_main, args=(cfg, name, ready, stop, results),
                               name="producer")
        t = time.monotonic()
        producer.start()
        if not ready.wait(cfg.timeout):
            producer.kill()
            raise RuntimeError(f"producer not ready after {cfg.timeout} s")
        out["producer_startup_s"] = time.monotonic() - t
    procs = []
    t0 = time.monotonic()
    try:
        for spec in plan:
            arrival = t0 + spec.index * gap - time.monotonic()
            if arrival > 0:
                time.sleep(arrival)  # the arrival gap (not a synchronization)
            p = ctx.Process(target=trial_main, name=f"trial-{spec.index}",
                            args=(mode, spec, cfg, name, time.monotonic(), results))
            p.start()
            procs.append(p)
        got = collect(results, procs, deadline)
    finally:  # the producer stops even when the driver fails (its trials then end too)
        if stop is not None:
            stop.set()
    if producer is not None:
        got.update(collect(results, [producer], deadline))
    for p in procs + ([producer] if producer else []):
        p.join()
    trials = [got[f"trial-{s.index}"] for s in plan]
    out["errors"] = [f"{r['who']}: {r['error']}" for r in got.values() if r["error"]]
    ok = [t for t in trials if not t["error"] and t.get("t_first") is not None]
    if len(ok) < len(plan) or out["errors"]:
        out.update(trials=trials, failed=True)
        return out
    prod = got.get("producer")
    used = sum(t["samples"] for t in trials)
    loading = prod["loading_cpu"] if prod else sum(t["workers_cpu"] for t in trials)
    loaded = prod["loads"] if prod else sum(t["loads"] for t in trials)
    mean = statistics.fmean
    out.update({
        "failed": False,
        "connect_mean_s": mean(t["t_connected"] - t["t_construct"] for t in trials),
        "connect_max_s": max(t["t_connected"] - t["t_construct"] for t in trials),
        "first_mean_s": mean(t["t_first"] - t["t_construct"] for t in trials),
        "first_max_s": max(t["t_first"] - t["t_construct"] for t in trials),
        "first_from_spawn_mean_s": mean(t["t_first"] - t["t_spawn"] for t in trials),
        "first_from_spawn_max_s": max(t["t_first"] - t["t_spawn"] for t in trials),
        "trial_time_mean_s": mean(t["t_end"] - t["t_spawn"] for t in trials),
        "makespan_s": max(t["t_end"] for t in trials) - min(t["t_spawn"] for t in trials),
        "cpu_all_s": cpu(resource.RUSAGE_CHILDREN) - cpu0,
        "trial_cpu_s": sum(t["own_cpu"] for t in trials),
        "loading_cpu_s": loading,
        "loading_ms_per_sample": 1e3 * loading / max(used, 1),
        "loading_ms_per_loaded": 1e3 * loading / max(loaded, 1),
        "samples_loaded": loaded,
        "samples_published": prod["stats"]["samples_published"] if prod else None,
        "samples_used": used,
        "epochs_complete": sum(t["epochs_complete"] for t in trials),
        "violations": sum(t["epochs_complete"] - t["epochs_exact"] for t in trials),
        "producer": prod, "trials": trials})
    return out


def spread(xs: list[float], fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(statistics.median(xs))} [{fmt.format(min(xs))}, {fmt.format(max(xs))}]"


COLUMNS = [  # (key, header, format)
    ("connect_mean_s", "connect mean (s)", "{:.2f}"),
    ("connect_max_s", "connect max (s)", "{:.2f}"),
    ("first_mean_s", "first batch mean (s)", "{:.2f}"),
    ("first_max_s", "first batch max (s)", "{:.2f}"),
    ("first_from_spawn_mean_s", "from spawn mean (s)", "{:.2f}"),
    ("trial_time_mean_s", "trial spawn to end, mean (s)", "{:.1f}"),
    ("makespan_s", "makespan (s)", "{:.1f}"), ("cpu_all_s", "CPU, all processes (s)", "{:.1f}"),
    ("trial_cpu_s", "trial CPU (s)", "{:.1f}"), ("loading_cpu_s", "loading CPU (s)", "{:.1f}"),
    ("loading_ms_per_sample", "loading CPU / sample used (ms)", "{:.2f}"),
    ("loading_ms_per_loaded", "loading CPU / sample loaded (ms)", "{:.2f}"),
    ("samples_loaded", "samples loaded", "{:,.0f}"), ("samples_used", "samples used", "{:,.0f}")]


def markdown(doc: dict[str, Any]) -> str:
    cfg, env = doc["config"], doc["env"]
    plan = ", ".join(f"{t['batch_size']}x{t['epochs']}" + ("p" if t["stop_after"] else "")
                     for t in doc["plan"])
    lines = [f"# A staggered sweep: a DataLoader per trial against one producer "
             f"({env['date'][:10]})",
             "", f"- Machine: {env['cpu']}, {env['cpus']} CPUs ({env['affinity']} usable); Python "
             f"{env['python']}, torch {env['torch']}, batchcast {env['batchcast']}.",
             f"- Command: `python benchmarks/staggered.py {' '.join(env['argv'])}` "
             f"({doc['elapsed_s'] / 60:.1f} min); {cfg['repeats']} repeats, modes alternated "
             "A B C A B C; median [min, max] over the repeats.",
             f"- {cfg['trials']} trials, one process each (spawn), every {cfg['gap']:g} s; "
             f"batch size x own epochs (p: pruned at {cfg['prune_at']:g} of its last epoch): "
             f"{plan}. "
             f"Each reads every batch once (a copy into a kept buffer), then sleeps the rest of "
             f"a {cfg['step_ms']:g} ms step.",
             f"- Loader: SyntheticImages({cfg['samples']}, size={cfg['size']}) as (image, index), "
             f"batch 64, shuffle with a seeded generator, {cfg['workers']} workers.",
             "", "| mode | " + " | ".join(h for _, h, _ in COLUMNS) + " | exactly once |",
             "|---|" + "---|" * (len(COLUMNS) + 1)]
    for mode in cfg["modes"]:
        runs = [r for r in doc["runs"] if r["mode"] == mode and not r["failed"]]
        failed = [r for r in doc["runs"] if r["mode"] == mode and r["failed"]]
        if mode in doc["skipped"]:
            lines.append(f"| {mode} | skipped: {doc['skipped'][mode]} |" + " |" * len(COLUMNS))
            continue
        cells = [spread([r[k] for r in runs], f) if runs else "-" for k, _, f in COLUMNS]
        bad = sum(r["violations"] for r in runs)
        epochs = sum(r["epochs_complete"] for r in runs)
        verdict = ("-" if not runs else f"yes ({epochs} epochs)" if bad == 0
                   else f"**no**: {bad} of {epochs} epochs")
        if failed:
            verdict += f"; **{len(failed)} runs failed**"
        lines.append(f"| {mode} | " + " | ".join(cells) + f" | {verdict} |")
    lines += ["", "- connect: constructing the trial's Consumer / DataLoader. first batch: from "
              "that construction to the first batch in hand; from spawn: from the driver's "
              "`Process.start()` (interpreter start and imports included).",
              "- trial spawn to end: each trial's time from its arrival to its end, its wait for "
              "data included (mean over the trials).",
              "- makespan: the first trial's spawn to the last trial's end (its loader closed).",
              "- CPU, all processes: `getrusage(RUSAGE_CHILDREN)` of the driver over the run "
              "(trials, producer, loader workers, each reaped; interpreter start-ups included). "
              "trial CPU: the trials' own processes (`RUSAGE_SELF`). loading CPU: the loader "
              "workers of every trial (dataloader), or the producer process and its workers "
              "from the moment it was serving (shared modes).",
              "- samples loaded: the dataset's `__getitem__` calls (workers' prefetch included); "
              "used: samples the trials received. exactly once: every complete epoch of every "
              "trial held each index once (violations: epochs that did not)."]
    if doc["skipped"]:
        lines += [""] + [f"- {m} not run: {why}" for m, why in doc["skipped"].items()]
    errors = [f"{r['mode']} #{r['repeat']}: {e}" for r in doc["runs"] for e in r["errors"]]
    lines += [f"- error: {e}" for e in errors]
    return "\n".join(lines) + "\n"


def plan_trials(args: argparse.Namespace) -> list[TrialSpec]:
    rng = random.Random(args.seed)
    lo, hi = args.epochs_per_trial[0], args.epochs_per_trial[-1]
    plan = []
    for i in range(args.trials):
        epochs = rng.randint(lo, hi)
        pruned = args.prune_every > 0 and (i + 1) % args.prune_every == 0
        plan.append(TrialSpec(i, BATCH_SIZES[i % len(BATCH_SIZES)], epochs,
                              int(args.samples * args.prune_at) if pruned else None))
    return plan


def now_refused() -> str | None:
    """Why the installed batchcast refuses late_join="now" (None: it accepts it)."""
    try:  # no producer of this name: an accepted option ends as ProducerLost after the timeout
        bc.Consumer(f"stagger-probe-{os.getpid()}", batch_size=1, timeout=0.1, join="now").close()
    except ValueError as exc:
        return f"the installed batchcast {bc.__version__} refuses it (ValueError: {exc})"
    except Exception:
        pass
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--gap", type=float, default=2.0, help="seconds between trial arrivals")
    ap.add_argument("--epochs-per-trial", type=int, nargs="+", default=[1, 2],
                    help="N, or MIN MAX: each trial's own epochs, drawn with --seed")
    ap.add_argument("--prune-every", type=int, default=3,
                    help="every N-th trial is pruned (0: none)")
    ap.add_argument("--prune-at", type=float, default=0.5, help="fraction of its last epoch")
    ap.add_argument("--samples", type=int, default=12288,
                    help="samples per epoch (default: an epoch several arrival gaps long)")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--step-ms", type=float, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--timeout", type=float, default=60, help="producer start-up / consumer wait")
    ap.add_argument("--run-timeout", type=float, default=600)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run (< 1 min) into benchmarks/.cache/")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    ap.add_argument("--stem", default="staggered", help="results file names: STEM.{md,json}")
    args = ap.parse_args()
    if args.quick:
        args.trials, args.gap, args.samples, args.size, args.repeats = 4, 0.5, 2048, 32, 1
        args.epochs_per_trial = [1, 2]
    if not 0 < args.prune_at < 1:
        ap.error("--prune-at must be in (0, 1)")
    out = Path(args.out or HERE / (".cache" if args.quick else "results"))
    cfg = Config(args.samples, args.size, args.workers, args.seed, args.step_ms, args.timeout)
    plan = plan_trials(args)
    skipped = {}
    if "now" in args.modes and (why := now_refused()):
        skipped["now"] = why
        print(f"note: mode 'now' skipped: {why}", flush=True)
    started = time.monotonic()
    ctx = mp.get_context("spawn")
    runs: list[dict[str, Any]] = []
    for r in range(args.repeats):
        for mode in (m for m in args.modes if m not in skipped):
            res = run(ctx, mode, plan, cfg, args.gap, f"stagger-{os.getpid()}-{len(runs)}",
                      args.run_timeout)
            res["repeat"] = r
            runs.append(res)
            if res["failed"]:
                print(f"#{r} {mode:<10} FAILED: {'; '.join(res['errors'])}", flush=True)
                continue
            print(f"#{r} {mode:<10} makespan {res['makespan_s']:5.1f} s, first batch mean "
                  f"{res['first_mean_s']:.2f} max {res['first_max_s']:.2f} s, CPU "
                  f"{res['cpu_all_s']:.1f} s (loading {res['loading_cpu_s']:.1f}), samples "
                  f"loaded {res['samples_loaded']:,} used {res['samples_used']:,}, "
                  f"{'exact' if res['violations'] == 0 else 'NOT exact'}", flush=True)
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                  if line.startswith("model name")), platform.processor())
    doc = {"env": {"date": datetime.datetime.now().isoformat(timespec="seconds"), "cpu": model,
                   "cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
                   "python": platform.python_version(), "torch": torch.__version__,
                   "batchcast": bc.__version__, "argv": sys.argv[1:]},
           "config": {**vars(args), "out": str(out)}, "plan": [asdict(t) for t in plan],
           "skipped": skipped, "runs": runs, "elapsed_s": time.monotonic() - started}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.stem}.json").write_text(json.dumps(doc, indent=1))
    (out / f"{args.stem}.md").write_text(markdown(doc))
    print("\n" + markdown(doc))
    print(f"written: {out / f'{args.stem}.md'}, {out / f'{args.stem}.json'}")


if __name__ == "__main__":
    main()

"""One shared loading pipeline against the alternatives, side by side.

    python benchmarks/compare.py --with-tensorsocket  # everything (~60 min on 2 CPUs)
    python benchmarks/compare.py                      # ... without TensorSocket (~40 min)
    python benchmarks/compare.py --quick              # smoke run, tiny sizes (< 3 min)

Systems, each fed the same data by the same loader settings (DataLoader with
the same workers, batch size and sampler), on the same CPU set, interleaved
and repeated (medians with [min, max]):

  dataloader    every trainer has its own DataLoader (what batchcast replaces)
  batchcast     one bc.Producer process, a bc.Consumer(name, batch_size) per trainer
  mpqueue       a torch.multiprocessing fan-out: one loader process, one bounded
                queue per trainer, rebatched in the trainer when its size differs
  tensorsocket  TensorSocket 0.0.5 through its own API (TensorProducer /
                TensorConsumer), only with --with-tensorsocket: installed into
                its own venv (benchmarks/.venv-tensorsocket, reusing this torch)
  plain         (overhead experiment only) a Python loop over batches in memory

Experiments (--experiments), one epoch each (exact: 2), long enough that
start-up stays under 10% of the window:

  busy      K = 1, 2, 4, 8 trainers, synthetic dataset with a set CPU cost per
            sample, 3,200 samples (100 loader batches of 32)
  jpeg      K = 1, 2, 4 trainers (--jpeg-ks), ImageNet-like JPEG pipeline (decode,
            RandomResizedCrop(224), flip, normalize), files generated once,
            3,200 samples (50 loader batches of 64)
  mixed     trainers with batch sizes 32 / 64 / 128 from a loader of 64
  speeds    trainers with steps of 10 / 20 / 40 ms, with the default ring and a
            larger one (batchcast+ring)
  (jpeg also runs batchcast+copy: the producer copies each batch into the
  ring, as it does when its loader's workers cannot write there)
  exact     correctness: 1,003 samples, loader batch 32, trainers of 24 / 32 / 100
  overhead  what receiving a batch costs a trainer that steps 20 ms per batch:
            process CPU per batch beyond a plain loop, time in next()

Each of busy, jpeg, mixed and speeds also runs one loader alone (the same
DataLoader, iterated by one process that reads every batch and never sleeps):
the bound, K x its rate unless the trainers' steps are the tighter limit.

The GPU step is emulated (no GPU here): a trainer takes a batch, reads all of
it once (a copy of every tensor into a buffer kept across steps, as a
host-to-device copy would), sleeps the rest of its step, and records the
sample indices it received; every trainer's indices are checked (distinct,
duplicated, missing per epoch).

Per configuration: aggregate samples/s over one common window (from the start
signal, given to every process at once after all are set up, to the last
trainer's last step) and its share of the bound; first batch, start-up (until
every trainer has its first batch) and its share of the window; per-trainer
samples/s; the read's time per batch; CPU seconds of every process of the
configuration (children included) per delivered sample; total memory (PSS
summed over all its processes, peak of samples over the whole run); each
trainer's share of time waiting for data (inside next()). Details:
benchmarks/README.md.

Writes <out>/compare.md (tables), compare.json (every raw measurement) and
compare.png (plot; needs matplotlib). --out defaults to benchmarks/results
(benchmarks/.cache/quick with --quick).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

TS_VERSION = "0.0.5"
SYSTEMS = ["dataloader", "batchcast", "mpqueue", "tensorsocket"]
EXPERIMENTS = ["busy", "jpeg", "mixed", "speeds", "exact", "overhead"]


# ---- the plan ------------------------------------------------------------------------
def busy(args, samples: int, cost_ms: float, shape=(3, 64, 64)) -> dict:
    return {"kind": "busy", "samples": samples, "cost_ms": cost_ms, "shape": list(shape),
            "workers": args.workers, "shuffle": True, "seed": 0}


def plan(args) -> list[dict]:
    """Every configuration: what is loaded, by which trainers, under which systems.
    Each workload of a trainer-count experiment also gets one loader alone
    (`<experiment>/alone`): the same DataLoader at the loader's batch size,
    iterated by one process that reads every batch and never sleeps; the bound
    of the experiment's configurations comes from it."""
    q = args.quick
    shared = [s for s in args.systems if s != "dataloader"]
    configs = []

    def add(cid, experiment, title, workload, lbs, epochs, trainers, systems, **extra):
        configs.append({"id": cid, "experiment": experiment, "title": title, "workload": workload,
                        "loader_batch": lbs, "epochs": epochs,
                        "trainers": [{"batch_size": b, "step_ms": s} for b, s in trainers],
                        "systems": [s for s in systems if s in args.systems or s == "plain"
                                    or s.split("+")[0] in args.systems],
                        "slots": args.slots, "repeats": extra.pop("repeats", args.repeats),
                        **extra})

    def alone(experiment, workload, lbs, epochs):
        """One loader alone, reading each batch as a trainer does, without a step."""
        configs.append({"id": f"{experiment}/alone", "experiment": "alone", "of": experiment,
                        "title": f"one loader alone ({experiment})", "workload": workload,
                        "loader_batch": lbs, "epochs": epochs,
                        "trainers": [{"batch_size": lbs, "step_ms": 0.0}],
                        "systems": ["dataloader"], "slots": args.slots, "repeats": args.repeats})

    if "busy" in args.experiments:
        w = busy(args, 640 if q else args.busy_samples, args.cost_ms)
        alone("busy", w, 32, args.epochs)
        for k in args.ks:
            add(f"busy/K={k}", "busy", f"synthetic {args.cost_ms:g} ms/sample", w, 32, args.epochs,
                [(32, args.step_ms)] * k, args.systems, alone="busy/alone")
    if "jpeg" in args.experiments:
        samples = 256 if q else args.jpeg_samples
        w = {"kind": "jpeg", "samples": samples, "files": min(samples, args.jpeg_files),
             "size": 224, "workers": args.workers, "shuffle": True, "seed": 0}
        alone("jpeg", w, 64, args.epochs)
        for k in ([1] if q else args.jpeg_ks or args.ks):
            add(f"jpeg/K={k}", "jpeg", "JPEG decode + RandomResizedCrop(224) + flip + normalize", w,
                64, args.epochs, [(64, args.step_ms)] * k,
                ["dataloader", "batchcast", "batchcast+copy", "mpqueue", "tensorsocket"],
                alone="jpeg/alone")
    if "mixed" in args.experiments:
        w = busy(args, 640 if q else args.mixed_samples, 2.0)
        alone("mixed", w, 64, args.epochs)
        add("mixed", "mixed", "batch sizes 32 / 64 / 128 from a loader of 64", w, 64, args.epochs,
            [(32, args.step_ms), (64, args.step_ms), (128, args.step_ms)], args.systems,
            alone="mixed/alone")
    if "speeds" in args.experiments:
        samples = 640 if q else args.speeds_samples
        w = busy(args, samples, 0.5)
        alone("speeds", w, 64, args.epochs)
        add("speeds", "speeds", "steps of 10 / 20 / 40 ms per batch of 64", w, 64, args.epochs,
            [(64, 10), (64, 20), (64, 40)],
            ["dataloader", "batchcast", "batchcast+ring", "mpqueue", "tensorsocket"],
            ring_slots=args.ring_slots or (samples // 64 * args.epochs + 2), alone="speeds/alone")
    if "exact" in args.experiments:
        add("exact", "exact", "1,003 samples, loader batch 32, trainers of 24 / 32 / 100",
            busy(args, 1003, 0.2, (3, 8, 8)), 32, 2, [(24, 2), (32, 2), (100, 2)], args.systems,
            repeats=1)
    if "overhead" in args.experiments:
        w = {"kind": "memory", "samples": 64 * (60 if q else args.overhead_batches),
             "shape": [3, 32, 32], "loader_batch": 64}
        add("overhead", "overhead", "receiving a batch, 20 ms step between batches", w, 64, 1,
            [(64, 20.0)], ["plain", *shared], detail=True)
    return configs


# ---- processes --------------------------------------------------------------------------
def set_subreaper() -> None:
    """Orphaned grandchildren (a killed trainer's loader workers) become our
    children: their CPU time is counted when we reap them, and none is left behind."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def cpu_of(proc) -> float:
    t = proc.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def tree_cpu(psutil) -> float:
    """CPU seconds of every descendant so far: the reaped ones (RUSAGE_CHILDREN)
    plus the live ones with the children they reaped."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = r.ru_utime + r.ru_stime
    for p in psutil.Process().children(recursive=True):
        try:
            total += cpu_of(p)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            pass
    return total


def tree_pss(psutil, roles: dict[int, str]) -> dict:
    """PSS of every descendant, summed, and by role (loader workers and helpers: other)."""
    out = {"total": 0, "trainers": 0, "producer": 0, "other": 0, "processes": 0, "per_trainer": []}
    for p in psutil.Process().children(recursive=True):
        try:
            pss = p.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
        role = roles.get(p.pid, "other")
        key = "trainers" if role.startswith("trainer") else role
        out[key] = out.get(key, 0) + pss
        out["total"] += pss
        out["processes"] += 1
        if key == "trainers":
            out["per_trainer"].append(pss)
    return out


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def tail(path: Path, lines: int = 6) -> str:
    try:
        text = [t for t in path.read_text(errors="replace").splitlines()
                if t.strip() and " DEBUG " not in t]
        return " | ".join(text[-lines:])
    except OSError:
        return ""


def ts_producer_batch(args, cfg: dict) -> int:
    """TensorSocket's producer_batch_size: loader batches per chunk it sends.
    Its smallest working setting: 2 when every trainer's batch divides two loader
    batches (1 crashes: IndexError in its collate), else 4 or 8 (smaller chunks
    livelock when a consumer batch spans chunks). On long runs 2 beat 4 and 8 at
    1 and 4 trainers: a larger chunk only adds what every consumer unpickles."""
    if args.ts_producer_batch_size:
        return args.ts_producer_batch_size
    lbs = cfg["loader_batch"]
    for pbs in (2, 4, 8):
        if all((pbs * lbs) % t["batch_size"] == 0 for t in cfg["trainers"]):
            return pbs
    return 8


def ts_payload_bytes(cfg: dict, pbs: int) -> int:
    """Bytes one TensorSocket broadcast pickles (each consumer unpickles all of
    it): every consumer slice pickles the whole chunk's storage."""
    from _compare.workloads import sample_bytes

    chunk = pbs * cfg["loader_batch"]
    per_sample = sample_bytes(cfg["workload"])
    return sum(max(1, chunk // t["batch_size"]) for t in cfg["trainers"]) * chunk * per_sample


def run_one(args, cfg: dict, system: str, repeat: int, psutil) -> dict:
    base, _, variant = system.partition("+")
    k = len(cfg["trainers"])
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=args.tmp))
    spec = {
        "system": base, "variant": variant, "label": system, "workload": cfg["workload"],
        "loader_batch": cfg["loader_batch"], "epochs": cfg["epochs"], "trainers": cfg["trainers"],
        "slots": cfg["ring_slots"] if variant == "ring" else cfg["slots"], "ring_bytes": 0,
        "name": f"cmp-{os.getpid()}-{uuid.uuid4().hex[:8]}", "cpus": args.cpu_list,
        "barrier": str(run_dir / "barrier.sock"), "run_dir": str(run_dir),
        "detail": cfg.get("detail", False), "timeout": args.run_timeout,
    }
    result = {"config": cfg["id"], "experiment": cfg["experiment"], "system": system,
              "repeat": repeat, "k": k, "errors": [], "spec": {key: v for key, v in spec.items()
                                                             if key not in ("barrier", "run_dir")}}
    if base == "tensorsocket":
        pbs = ts_producer_batch(args, cfg)
        payload = ts_payload_bytes(cfg, pbs)
        spec["ts"] = {"ports": free_ports(4), "producer_batch_size": pbs}
        result["spec"]["ts"] = {"producer_batch_size": pbs, "payload_bytes": payload}
        if payload > args.ts_max_payload_mb * 2**20:
            result["skipped"] = (f"not run: each of its broadcasts would pickle "
                                 f"{payload / 2**30:.1f} GiB (every consumer unpickles all "
                                 f"of it); limit --ts-max-payload-mb "
                                 f"{args.ts_max_payload_mb}")
            shutil.rmtree(run_dir, ignore_errors=True)
            return result
    spec_path = run_dir / "spec.json"
    spec_path.write_text(json.dumps(spec))

    from _compare.barrier import Server

    server = Server(spec["barrier"])
    python = args.ts_python if base == "tensorsocket" else sys.executable
    cpus = args.cpu_list

    def launch(role: str, cli_role: str, index: int = 0) -> subprocess.Popen:
        log = open(run_dir / f"{role}.log", "wb")
        try:
            return subprocess.Popen([python, str(HERE / "compare.py"), "--role", cli_role,
                                     "--spec", str(spec_path), "--index", str(index)],
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    preexec_fn=lambda: os.sched_setaffinity(0, cpus))
        finally:
            log.close()

    procs: dict[str, subprocess.Popen] = {}
    if base == "batchcast":
        procs["producer"] = launch("producer", "producer")
    elif base == "tensorsocket":
        procs["producer"] = launch("producer", "ts-producer")
    elif base == "mpqueue":
        procs["producer"] = launch("producer", "fanout")  # it starts the trainers
    if base != "mpqueue":
        for i in range(k):
            procs[f"trainer{i}"] = launch(f"trainer{i}", "trainer", i)
    expected = k + (base != "dataloader" and base != "plain")
    pidfds = {os.pidfd_open(p.pid): role for role, p in procs.items()}
    started = time.monotonic()
    deadline = started + args.run_timeout
    kill_at = None
    t_go = cpu_go = None
    pss_ready, pss_peak, next_pss = None, None, None
    pss_series: list[list[float]] = []  # [seconds after the start, total bytes] of every sample
    ended = False
    finished: set[str] = set()
    firsts: set[str] = set()
    sampler_cpu = 0.0  # this process's CPU for memory samples (not in the configuration's)
    phases: dict[str, float] = {}  # seconds after launch: go, finished, exited, cleaned
    cpu_window = None

    def end(reason: str, roles=None) -> None:
        server.broadcast("end", roles=roles, reason=reason)

    try:
        while any(p.poll() is None for p in procs.values()):
            now = time.monotonic()
            wake = [deadline, kill_at or deadline] + ([next_pss] if next_pss else [])
            readable, _, _ = select.select(server.fds() + list(pidfds), [], [],
                                           max(0.0, min(wake) - now))
            for m in server.handle([r for r in readable if not isinstance(r, int)]):
                if m["kind"] == "first":
                    firsts.add(m["role"])
                    if len(firsts) == k:
                        next_pss = time.monotonic()  # every trainer has data: sample now
                if m["kind"] == "finished":
                    finished.add(m["role"])
                    if len(finished) == k and cpu_window is None and cpu_go is not None:
                        cpu_window = tree_cpu(psutil) - cpu_go
                        phases["finished"] = time.monotonic() - started
                if m["kind"] == "done" and base == "tensorsocket" and not ended:
                    end("producer finished", roles=[f"trainer{i}" for i in range(k)])
                    ended = True
            for fd in [r for r in readable if isinstance(r, int)]:
                role = pidfds.pop(fd)
                os.close(fd)
                code = procs[role].wait()
                phases[f"exit:{role}"] = time.monotonic() - started
                if code != 0:
                    result["errors"].append(
                        f"{role} exited with {code}: {tail(run_dir / f'{role}.log')}")
                if role == "producer" and t_go is not None and not ended and (
                        base == "tensorsocket" or code != 0):
                    end("producer finished" if base == "tensorsocket"
                        else f"producer exited ({code})",
                        roles=[f"trainer{i}" for i in range(k)])
                    ended = True
                if t_go is None and code != 0:
                    end("setup failed")
                    kill_at = time.monotonic() + 10
            if t_go is None and len(server.ready) >= expected:
                roles = {m["pid"]: r for r, m in server.ready.items()}
                pss_ready = tree_pss(psutil, roles)
                cpu_go = tree_cpu(psutil)
                t_go = time.perf_counter()
                server.broadcast("go", t_go=t_go)
                phases["go"] = time.monotonic() - started
                next_pss = time.monotonic() + args.pss_interval  # then every interval to the end
            now = time.monotonic()
            if next_pss and now >= next_pss and len(finished) < k:
                c0 = time.process_time()
                sample = tree_pss(psutil, {m["pid"]: r for r, m in server.ready.items()})
                sampler_cpu += time.process_time() - c0
                sample["at_s"] = time.perf_counter() - t_go
                pss_series.append([round(sample["at_s"], 3), sample["total"]])
                if pss_peak is None or sample["total"] > pss_peak["total"]:
                    pss_peak = sample
                next_pss = now + args.pss_interval
            if now >= deadline and kill_at is None:
                result["errors"].append(f"deadline: no result within {args.run_timeout:g} s "
                                        f"({'running' if t_go else 'setting up'})")
                end("deadline")
                kill_at = now + 15
            if kill_at and now >= kill_at:
                for p in psutil.Process().children(recursive=True):
                    try:
                        p.kill()
                    except psutil.NoSuchProcess:
                        pass
                kill_at = now + 5
    finally:
        for fd in pidfds:
            os.close(fd)
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        server.close()
    phases["exited"] = time.monotonic() - started
    # what is left (loader workers of a killed trainer, helpers): give them a moment, then stop them
    rest = psutil.Process().children(recursive=True)
    _, alive = psutil.wait_procs(rest, timeout=5)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    if rest:
        result["leftover_processes"] = [p.pid for p in rest]
    result["wall_s"] = phases["cleaned"] = time.monotonic() - started
    result["phases"] = phases
    if t_go is None:
        result["errors"].append("never started: " + "; ".join(
            f"{r}: {tail(run_dir / f'{r}.log')}" for r in procs))
        shutil.rmtree(run_dir, ignore_errors=True) if not args.keep_runs else None
        return result
    cpu_total = tree_cpu(psutil) - cpu_go  # to the last exit: teardown included
    cpu_s = cpu_window if cpu_window is not None else cpu_total
    trainers = []
    for i in range(k):
        f = run_dir / f"trainer{i}.json"
        if f.exists():
            trainers.append(json.loads(f.read_text()))
        else:
            trainers.append({"role": f"trainer{i}", "status": "no result", "samples": 0,
                             "rate": 0.0, "exact": False, "epochs": [], "t_end": None})
            result["errors"].append(f"trainer{i}: no result: {tail(run_dir / f'trainer{i}.log')}")
    producer = run_dir / "producer.json"
    result["producer"] = json.loads(producer.read_text()) if producer.exists() else None
    samples = sum(t["samples"] for t in trainers)
    ends = [t["t_end"] for t in trainers if t.get("t_end") is not None]
    window = (max(ends) - t_go) if ends else float("nan")
    result.update({
        "t_go": t_go, "window_s": window, "samples": samples,
        "aggregate": samples / window if window and window > 0 else 0.0,
        "per_trainer": [t["rate"] for t in trainers],
        "wait_share": [t.get("wait_share") for t in trainers],
        "cpu_s": cpu_s, "cpu_per_sample_ms": cpu_s / samples * 1e3 if samples else None,
        "cpu_to_exit_s": cpu_total,
        "pss_ready": pss_ready, "pss_peak": pss_peak or pss_ready, "pss_sampler_cpu_s": sampler_cpu,
        "pss_samples": pss_series,
        "exact": all(t["exact"] for t in trainers) and len(trainers) == k,
        "trainers": trainers,
    })
    result.update(steady(trainers, t_go))
    result["startup_share"] = (result["startup_s"] / window
                               if result["startup_s"] is not None and window > 0 else None)
    reads = [t.get("read_median_s") for t in trainers if t.get("read_median_s") is not None]
    result["read_median_s"] = statistics.median(reads) if reads else None
    # the trainers' reads, as a share of the CPUs over the window (time reading, all trainers)
    read_s = sum(t.get("read_s") or 0.0 for t in trainers)
    result["read_cpu_share"] = read_s / window / len(args.cpu_list) if window > 0 else None
    if args.keep_runs:
        result["run_dir"] = str(run_dir)
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
    return result


def steady(trainers: list[dict], t_go: float) -> dict:
    """Throughput once every trainer is running and before any has finished:
    samples that arrived between the last trainer's first batch and the first
    trainer's last batch, over that span (start-up and tail excluded)."""
    firsts = [t["arrivals"][0] for t in trainers if t.get("arrivals")]
    lasts = [t["arrivals"][-1] for t in trainers if t.get("arrivals")]
    out = {"first_batch_s": [f - t_go for f in firsts], "steady": None, "steady_window_s": None,
           "startup_s": None}
    if len(firsts) < len(trainers) or not firsts:
        return out
    out["startup_s"] = max(firsts) - t_go  # until every trainer has its first batch
    w0, w1 = max(firsts), min(lasts)
    inside = [sum(1 for when in t["arrivals"] if w0 < when <= w1) for t in trainers]
    if w1 - w0 <= 0 or min(inside) < 3:  # too short to say
        return out
    n = sum(size for t in trainers for when, size in zip(t["arrivals"], t["sizes"])
            if w0 < when <= w1)
    out.update(steady=n / (w1 - w0), steady_window_s=w1 - w0)
    return out


# ---- TensorSocket -------------------------------------------------------------------------
def ensure_tensorsocket(venv: Path) -> str:
    """TensorSocket 0.0.5 in its own venv that reuses this interpreter's torch:
    created with --system-site-packages, and pip never resolves dependencies
    (--no-deps), so it cannot pull another torch."""
    import torch

    python = venv / "bin" / "python"
    probe = ("import tensorsocket, tornado, zmq, torch, json; print(json.dumps("
             "[tensorsocket.__version__, torch.__version__, torch.__file__]))")

    def check():
        r = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
        return json.loads(r.stdout) if r.returncode == 0 else None

    found = check() if python.exists() else None
    if found is None or found[0] != TS_VERSION:
        print(f"installing tensorsocket {TS_VERSION} into {venv} ...", flush=True)
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                           check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps",
                        f"tensorsocket=={TS_VERSION}", "tornado>=6.0.0", "pyzmq>=25.0.0"],
                       check=True)
        found = check()
    if found is None:
        sys.exit(f"tensorsocket does not import in {venv}")
    if found[2] != torch.__file__:
        sys.exit(f"{venv} resolves torch to {found[2]}, not this interpreter's {torch.__file__}; "
                 f"remove the venv and rerun")
    return str(python)


# ---- environment ------------------------------------------------------------------------
def environment(args) -> dict:
    import torch

    import batchcast

    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": {"cpu": model, "cpus": os.cpu_count(), "cpu_set": args.cpu_list,
                    "arch": platform.machine(), "kernel": platform.release(),
                    "memory_gib": round(os.sysconf("SC_PAGE_SIZE")
                                        * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)},
        "python": platform.python_version(), "torch": torch.__version__,
        "batchcast": getattr(batchcast, "__version__", "?"),
        "batchcast_git": git_describe(),
        "tensorsocket": TS_VERSION if "tensorsocket" in args.systems else None,
        "gpu_step": "emulated: the trainer reads the batch once, then sleeps the rest of its step "
                    "(no GPU)",
        "argv": sys.argv[1:],
        "settings": {k: v for k, v in vars(args).items()
                     if k not in ("ts_python", "tmp", "cpu_list", "out")},
    }


def git_describe() -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(HERE), "describe", "--always", "--dirty"],
                           capture_output=True, text=True, timeout=10)
        return r.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def parse_cpus(text: str) -> list[int]:
    out = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--role":
        ap = argparse.ArgumentParser()
        ap.add_argument("--role")
        ap.add_argument("--spec")
        ap.add_argument("--index", type=int, default=0)
        a = ap.parse_args()
        from _compare import roles

        roles.main(a.role, a.spec, a.index)
        return

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: every system and experiment, tiny sizes")
    ap.add_argument("--with-tensorsocket", action="store_true",
                    help=f"also run TensorSocket {TS_VERSION} (installed into --ts-venv)")
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS, default=None,
                    help="default: dataloader batchcast mpqueue "
                         "(+ tensorsocket with --with-tensorsocket)")
    ap.add_argument("--experiments", nargs="+", choices=EXPERIMENTS, default=EXPERIMENTS)
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8],
                    help="trainer counts (busy)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="runs of each configuration, interleaved")
    ap.add_argument("--cpus", default="",
                    help="CPU set for every process, e.g. 0-1 (default: all allowed)")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers per loader")
    ap.add_argument("--epochs", type=int, default=1, help="epochs (all but exact, which has 2)")
    ap.add_argument("--step-ms", type=float, default=10.0,
                    help="emulated GPU step (busy, jpeg, mixed)")
    ap.add_argument("--cost-ms", type=float, default=5.0, help="CPU per sample of the busy dataset")
    ap.add_argument("--busy-samples", type=int, default=3200, help="samples per epoch (busy)")
    ap.add_argument("--jpeg-samples", type=int, default=3200, help="samples per epoch (jpeg)")
    ap.add_argument("--jpeg-files", type=int, default=512,
                    help="distinct JPEG files (sample i decodes file i %% files)")
    ap.add_argument("--jpeg-ks", type=int, nargs="+", default=[1, 2, 4],
                    help="trainer counts of the jpeg experiment (1 2 4 8: ~6 min more)")
    ap.add_argument("--mixed-samples", type=int, default=6400, help="samples per epoch (mixed)")
    ap.add_argument("--speeds-samples", type=int, default=6400, help="samples per epoch (speeds)")
    ap.add_argument("--overhead-batches", type=int, default=300)
    ap.add_argument("--slots", type=int, default=8,
                    help="batchcast ring slots; queue depth of the others")
    ap.add_argument("--ring-slots", type=int, default=0,
                    help="slots of batchcast+ring in the speeds experiment (default: both epochs)")
    ap.add_argument("--run-timeout", type=float, default=300.0, help="seconds one run may take")
    ap.add_argument("--pss-interval", type=float, default=1.0,
                    help="seconds between memory samples, from the start to the last trainer's end "
                         "(also one when every trainer has its first batch)")
    ap.add_argument("--pss-tolerance", type=float, default=0.03,
                    help="PSS target: K=8 may exceed K=1 + the extra interpreters by this fraction")
    ap.add_argument("--ts-venv", default=str(HERE / ".venv-tensorsocket"))
    ap.add_argument("--ts-producer-batch-size", type=int, default=0,
                    help="TensorSocket producer_batch_size (default: its smallest working setting)")
    ap.add_argument("--ts-max-payload-mb", type=float, default=512,
                    help="skip TensorSocket configurations whose broadcasts pickle more than this")
    ap.add_argument("--out", default="", help="output folder (default benchmarks/results)")
    ap.add_argument("--keep-runs", action="store_true",
                    help="keep each run's folder (logs, raw files)")
    args = ap.parse_args()

    if args.systems is None:
        args.systems = SYSTEMS[:3] + (["tensorsocket"] if args.with_tensorsocket else [])
    elif "tensorsocket" in args.systems:
        args.with_tensorsocket = True
    if args.quick:
        args.repeats = 1
        args.ks = [2]
        args.run_timeout = min(args.run_timeout, 60)
    args.cpu_list = parse_cpus(args.cpus) or sorted(os.sched_getaffinity(0))
    out = Path(args.out) if args.out else (
        HERE / ".cache" / "quick" if args.quick else HERE / "results")
    out.mkdir(parents=True, exist_ok=True)
    args.out = str(out)

    try:
        import psutil
    except ImportError:
        sys.exit("compare.py needs psutil: pip install psutil")
    try:
        import batchcast  # noqa: F401  (fail here, not in every run)
    except ImportError as exc:
        sys.exit(f"batchcast does not import: {exc}")
    args.ts_python = (ensure_tensorsocket(Path(args.ts_venv))
                      if "tensorsocket" in args.systems else None)
    set_subreaper()
    args.tmp = tempfile.mkdtemp(prefix="compare-")  # run folders; batchcast's sockets too
    os.environ.setdefault("BATCHCAST_RUNTIME_DIR", os.path.join(args.tmp, "runtime"))

    configs = plan(args)
    if any(c["workload"]["kind"] == "jpeg" for c in configs):
        from _compare.workloads import ensure_jpegs

        folder = ensure_jpegs(HERE / ".cache", max(c["workload"]["files"] for c in configs
                                                   if c["workload"]["kind"] == "jpeg"))
        for c in configs:
            if c["workload"]["kind"] == "jpeg":
                c["workload"]["jpeg_dir"] = str(folder)

    from _compare import report

    env = environment(args)
    doc = {"env": env, "configs": configs, "runs": []}
    print(report.header(env), flush=True)
    total = sum(len(c["systems"]) * c["repeats"] for c in configs)
    done, t_start = 0, time.monotonic()
    for r in range(args.repeats):
        for cfg in configs:
            if r >= cfg["repeats"]:
                continue
            turn = r % len(cfg["systems"])
            systems = cfg["systems"][turn:] + cfg["systems"][:turn]
            for system in systems:
                res = run_one(args, cfg, system, r, psutil)
                doc["runs"].append(res)
                done += 1
                print(f"[{done}/{total} {time.monotonic() - t_start:5.0f}s] "
                      f"{report.one_line(res)}", flush=True)
                (out / "compare.json").write_text(json.dumps(doc, indent=1))
    doc["elapsed_s"] = time.monotonic() - t_start
    (out / "compare.json").write_text(json.dumps(doc, indent=1))
    text = report.markdown(doc)
    note = report.plot(doc, out / "compare.png")
    if note:
        text += f"\n{note}\n"
    (out / "compare.md").write_text(text)
    print("\n" + text)
    print(f"written: {out / 'compare.md'}, {out / 'compare.json'}"
          + ("" if note else f", {out / 'compare.png'}"))
    if not args.keep_runs:
        shutil.rmtree(args.tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

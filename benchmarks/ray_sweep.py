"""A sweep on a local multi-node Ray cluster: one batchcast producer per node
(batchcast.ray) against a DataLoader per trial, same trials, same loader.

    python benchmarks/ray_sweep.py                  # 2 nodes, 4 trials, 3 repeats (~2 min on 2 CPUs)
    python benchmarks/ray_sweep.py --nodes 3 --trials 6 --repeats 5

Each trial is a Ray task pinned to a node (round robin) that reads its batches
like a GPU trainer: every batch is read once (a copy into a buffer kept across
steps, as a host-to-device copy would), then the rest of an emulated GPU step
is slept. The loader is batchcast's synthetic image pipeline (decode-like CPU
work per sample), batch 64, with --workers workers; a trial's batch size is
its own (32 / 64 / 48 / 100 in turn). Reported per mode (median [min, max]
over the repeats, modes alternated):

- aggregate samples/s: samples every trial received over one window (the
  first trial's start to the last trial's end);
- loading CPU per node: batchcast, the node's producer actor and its loader
  workers; a DataLoader per trial, the loader workers of the node's trials;
- trial CPU: the trials' own processes (receiving, reading, stepping);
- exactly once: every trial got every sample of every epoch exactly once.

Every "node" runs on this machine, so all share its CPUs. Results go to
benchmarks/results/ray_sweep.{md,json}.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import sys
import statistics
import time
from pathlib import Path
from typing import Any

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from torch.utils.data import DataLoader

import batchcast as bc
from batchcast.synthetic import SyntheticImages

HERE = Path(__file__).resolve().parent
NAME = "ray-sweep"
BATCH_SIZES = [32, 64, 48, 100]


def make_loader(samples: int, size: int, workers: int, batch_size: int = 64) -> DataLoader:
    return DataLoader(SyntheticImages(samples, size=size), batch_size=batch_size,
                      num_workers=workers)


def cpu() -> tuple[float, float]:
    """(this process, its children that exited) CPU seconds."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


@ray.remote(max_retries=0)
def trial(mode: str, index: int, cfg: dict[str, Any]) -> dict[str, Any]:
    torch.set_num_threads(1)
    own0, kids0 = cpu()
    t0 = time.time()
    bs = BATCH_SIZES[index % len(BATCH_SIZES)]
    samples, size, workers = cfg["samples"], cfg["size"], cfg["workers"]
    if mode == "batchcast":
        loader = bc.ray.consumer(NAME, lambda: make_loader(samples, size, workers), batch_size=bs,
                                 producer_options={"min_consumers": cfg["per_node"],
                                                   "epochs": cfg["epochs"]})
    else:
        loader = make_loader(samples, size, workers, bs)
    buffer = None
    exact, got = True, 0
    step = cfg["step_ms"] / 1e3
    for _ in range(cfg["epochs"]):
        seen = []
        for images, _labels, index_ in loader:
            r = time.perf_counter()
            if buffer is None or buffer.shape[0] < len(images):
                buffer = torch.empty_like(images)
            buffer[:len(images)].copy_(images)  # the trainer reads its batch once
            r = time.perf_counter() - r
            seen += index_.tolist()
            if step > r:
                time.sleep(step - r)
        exact &= sorted(seen) == list(range(samples))
        got += len(seen)
    if mode == "batchcast":
        loader.close()
    del loader  # a DataLoader's workers exit with its iterators, so their CPU is counted
    own1, kids1 = cpu()
    return {"node": ray.get_runtime_context().get_node_id(), "batch_size": bs, "t0": t0,
            "t1": time.time(), "samples": got, "exact": exact, "own_cpu": own1 - own0,
            "worker_cpu": kids1 - kids0}


def run(mode: str, nodes: list[str], cfg: dict[str, Any]) -> dict[str, Any]:
    refs = [trial.options(num_cpus=cfg["trial_cpus"], scheduling_strategy=NodeAffinitySchedulingStrategy(
        nodes[i % len(nodes)], soft=False)).remote(mode, i, cfg) for i in range(cfg["trials"])]
    try:
        trials = ray.get(refs, timeout=cfg["timeout"])
    finally:
        producers = bc.ray.shutdown(NAME) if mode == "batchcast" else []
    window = max(t["t1"] for t in trials) - min(t["t0"] for t in trials)
    loading = {n: 0.0 for n in nodes}
    for p in producers:
        loading[p["node_id"]] += p["cpu_seconds"]
    if mode == "dataloader":
        for t in trials:
            loading[t["node"]] += t["worker_cpu"]
    return {"mode": mode, "window_s": window,
            "aggregate": sum(t["samples"] for t in trials) / window,
            "loading_cpu_per_node": [loading[n] for n in nodes],
            "trial_cpu": sum(t["own_cpu"] for t in trials),
            "exact": all(t["exact"] for t in trials) and len(trials) == cfg["trials"],
            "trials": trials, "producers": [{k: p[k] for k in ("node_id", "pid", "leases",
                                                              "cpu_seconds")}
                                            for p in producers]}


def spread(xs: list[float], fmt: str = "{:,.0f}") -> str:
    return f"{fmt.format(statistics.median(xs))} [{fmt.format(min(xs))}, {fmt.format(max(xs))}]"


def markdown(doc: dict[str, Any]) -> str:
    cfg, env = doc["config"], doc["env"]
    by = {m: [r for r in doc["runs"] if r["mode"] == m] for m in ("dataloader", "batchcast")}
    lines = [f"# batchcast.ray: one producer per node against a DataLoader per trial "
             f"({env['date'][:10]})", "",
             f"- Machine: {env['cpu']}, {env['cpus']} CPUs; Python {env['python']}, torch "
             f"{env['torch']}, Ray {env['ray']}, batchcast {env['batchcast']}.",
             f"- Command: `python benchmarks/ray_sweep.py {' '.join(env['argv'])}` "
             f"({doc['elapsed_s'] / 60:.1f} min); {cfg['repeats']} repeats, modes alternated; "
             "median [min, max].",
             f"- A local Ray cluster (ray.cluster_utils): a head without CPUs and {cfg['nodes']} "
             f"nodes of {cfg['cpus_per_node']:g} CPUs, all on this machine's {env['cpus']} CPUs. "
             f"{cfg['trials']} trials, {cfg['trial_cpus']:g} CPU each, pinned to the nodes in "
             f"turn, batch sizes {', '.join(str(BATCH_SIZES[i % 4]) for i in range(cfg['trials']))}.",
             f"- Loader: batchcast's synthetic image pipeline ({cfg['size']}x{cfg['size']}), "
             f"{cfg['samples']} samples per epoch, {cfg['epochs']} epochs, loader batch 64, "
             f"{cfg['workers']} workers per loader. A trial reads each batch once (a copy into a "
             f"buffer kept across steps), then sleeps the rest of a {cfg['step_ms']:g} ms step.",
             "- Loading CPU per node: the node's producer actor and its loader workers "
             "(batchcast), or the loader workers of the node's trials (DataLoader per trial). "
             "Trial CPU: the trials' own processes.", "",
             "| mode | aggregate samples/s | loading CPU per node (s) | trial CPU, all trials (s) "
             "| window (s) | every sample exactly once |",
             "|---|---|---|---|---|---|"]
    names = {"dataloader": "DataLoader per trial", "batchcast": "batchcast, one producer per node"}
    for mode, runs in by.items():
        if not runs:
            continue
        per_node = [x for r in runs for x in r["loading_cpu_per_node"]]
        lines.append(f"| {names[mode]} | {spread([r['aggregate'] for r in runs])} | "
                     f"{spread(per_node, '{:.1f}')} | {spread([r['trial_cpu'] for r in runs], '{:.1f}')}"
                     f" | {spread([r['window_s'] for r in runs], '{:.1f}')} | "
                     f"{'yes' if all(r['exact'] for r in runs) else '**no**'} |")
    if by["dataloader"] and by["batchcast"]:
        agg = [b["aggregate"] / d["aggregate"] for d, b in zip(by["dataloader"], by["batchcast"])]
        load = [sum(d["loading_cpu_per_node"]) / max(sum(b["loading_cpu_per_node"]), 1e-9)
                for d, b in zip(by["dataloader"], by["batchcast"])]
        lines += ["", f"batchcast / DataLoader per trial, pair by pair: aggregate "
                  f"{spread(agg, '{:.2f}')}×; loading CPU {spread(load, '{:.2f}')}× less."]
        lines += ["", "Producers per run (batchcast): "
                  + "; ".join(f"{len(r['producers'])} producers, leases "
                              f"{sorted(p['leases'] for p in r['producers'])}"
                              for r in by["batchcast"]) + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--cpus-per-node", type=float, default=2)
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--trial-cpus", type=float, default=1)
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--step-ms", type=float, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args()
    from ray.cluster_utils import Cluster

    started = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "object_store_memory": 100 * 2**20, "include_dashboard": False})
    nodes = [cluster.add_node(num_cpus=args.cpus_per_node, object_store_memory=100 * 2**20)
             for _ in range(args.nodes)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    cfg = {**vars(args), "per_node": -(-args.trials // args.nodes)}
    cfg.pop("out")
    runs = []
    try:
        for r in range(args.repeats):
            for mode in (("dataloader", "batchcast") if r % 2 == 0 else ("batchcast", "dataloader")):
                res = run(mode, [n.node_id for n in nodes], cfg)
                res["repeat"] = r
                runs.append(res)
                print(f"#{r} {mode:<10} {res['aggregate']:7.0f} samples/s over {res['window_s']:.1f} s, "
                      f"loading CPU per node {[round(x, 1) for x in res['loading_cpu_per_node']]} s, "
                      f"trial CPU {res['trial_cpu']:.1f} s, {'exact' if res['exact'] else 'NOT exact'}",
                      flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                  if line.startswith("model name")), platform.processor())
    doc = {"env": {"date": datetime.datetime.now().isoformat(timespec="seconds"), "cpu": model,
                   "cpus": os.cpu_count(), "python": platform.python_version(),
                   "torch": torch.__version__, "ray": ray.__version__,
                   "batchcast": bc.__version__, "argv": sys.argv[1:]},
           "config": cfg, "runs": runs, "elapsed_s": time.monotonic() - started}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ray_sweep.json").write_text(json.dumps(doc, indent=1))
    (out / "ray_sweep.md").write_text(markdown(doc))
    print("\n" + markdown(doc))
    print(f"written: {out / 'ray_sweep.md'}, {out / 'ray_sweep.json'}")


if __name__ == "__main__":
    main()

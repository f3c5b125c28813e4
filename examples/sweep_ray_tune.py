"""A Ray Tune sweep over several nodes, each node's trials fed by that node's
one batchcast producer; then the same sweep with a DataLoader per trial.

    python examples/sweep_ray_tune.py                        # a local cluster of 2 nodes
    python examples/sweep_ray_tune.py --nodes 3 --trials 6 --epochs 3
    python examples/sweep_ray_tune.py --address auto         # an existing Ray cluster

Trials differ in learning rate and batch size. The only batchcast line in the
trainable is its loader: ``bc.ray.consumer(NAME, make_loader, batch_size=...)``.
The first trial on a node starts that node's producer (a Ray actor that asks
for no CPU), the others there find it, and ``bc.ray.shutdown()`` ends them all
when the sweep is over. Prints each trial's result, then the wall time and
the CPU time of both sweeps (the trials' processes with their loader workers,
plus the producers with theirs) and what sharing saved.

Without --address it starts a local multi-node cluster (ray.cluster_utils):
every "node" runs on this machine, so the nodes share its CPUs.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from typing import Any

import ray
import torch
from ray import tune
from torch import nn
from torch.utils.data import DataLoader

import batchcast as bc
from batchcast.synthetic import SyntheticImages

NAME = "tune-sweep"
LEARNING_RATES = [0.1, 0.03, 0.01, 0.003]
BATCH_SIZES = [32, 64, 48, 100]


def make_loader(samples: int, size: int, workers: int) -> DataLoader:
    """The pipeline every trial would otherwise run for itself; the same on
    every node."""
    return DataLoader(SyntheticImages(samples, size=size), batch_size=64, num_workers=workers)


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # loader workers that exited
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def train(config: dict[str, Any]) -> None:
    """A Tune trainable: an ordinary training loop whose loader is batchcast's
    (config["shared"]) or its own DataLoader."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cpu0, started = cpu_seconds(), time.perf_counter()
    samples, size, workers = config["samples"], config["size"], config["workers"]
    if config["shared"]:
        # The node's producer serves the sweep's epochs, starting once the
        # trials a node runs at once have joined (so each sees every epoch).
        loader = bc.ray.consumer(NAME, lambda: make_loader(samples, size, workers),
                                 batch_size=config["batch_size"],
                                 producer_options={"epochs": config["epochs"],
                                                   "min_consumers": config["per_node"]})
    else:
        loader = DataLoader(SyntheticImages(samples, size=size), batch_size=config["batch_size"],
                            num_workers=workers)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    exactly_once = True
    for epoch in range(config["epochs"]):
        seen, loss_sum = [], 0.0
        for images, labels, index in loader:
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(index)
            seen += index.tolist()
        exactly_once &= sorted(seen) == list(range(samples))
        tune.report({"epoch": epoch, "loss": loss_sum / max(len(seen), 1),
                     "exactly_once": exactly_once, "seconds": time.perf_counter() - started,
                     "cpu": cpu_seconds() - cpu0,
                     "node": ray.get_runtime_context().get_node_id()[:8]})
    if config["shared"]:
        loader.close()


def sweep(args: argparse.Namespace, shared: bool, storage: str) -> tuple[list[dict], float, float]:
    """Runs the trials; returns their last results, the wall seconds, and the
    producers' CPU seconds (0 without batchcast)."""
    space = {"lr": tune.grid_search(LEARNING_RATES[:min(args.trials, 4)]),
             "batch_size": tune.sample_from(
                 lambda config: BATCH_SIZES[LEARNING_RATES.index(config["lr"])]),
             "shared": shared, "epochs": args.epochs, "samples": args.samples,
             "size": args.size, "workers": args.workers, "per_node": args.trials_per_node}
    tuner = tune.Tuner(
        tune.with_resources(train, {"cpu": args.trial_cpus}),
        param_space=space,
        tune_config=tune.TuneConfig(num_samples=-(-args.trials // min(args.trials, 4))),
        run_config=tune.RunConfig(name="shared" if shared else "own", storage_path=storage,
                                  verbose=0),
    )
    started = time.perf_counter()
    try:
        grid = tuner.fit()
    finally:  # the producers end with the sweep, however it ends; each reports its CPU
        producers_cpu = sum(p["cpu_seconds"] for p in bc.ray.shutdown(NAME))
    wall = time.perf_counter() - started
    results = []
    for r in grid:
        if r.error:
            raise RuntimeError(f"trial {r.config['lr']}/{r.config['batch_size']} failed: {r.error}")
        results.append({**r.metrics, "lr": r.config["lr"], "batch_size": r.config["batch_size"]})
    return results, wall, producers_cpu


def print_results(title: str, results: list[dict]) -> None:
    print(f"\n{title}")
    print(f"{'lr':>8} {'batch':>6} {'node':>9} {'loss':>8} {'exactly once':>13} {'train s':>8} "
          f"{'CPU s':>6}")
    for r in sorted(results, key=lambda r: (r["lr"], r["batch_size"])):
        print(f"{r['lr']:>8.3g} {r['batch_size']:>6} {r['node']:>9} {r['loss']:>8.4f} "
              f"{str(r['exactly_once']):>13} {r['seconds']:>8.2f} {r['cpu']:>6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", help="an existing Ray cluster (default: start a local one)")
    parser.add_argument("--nodes", type=int, default=2, help="local cluster: worker nodes")
    parser.add_argument("--cpus-per-node", type=float, default=2, help="local cluster")
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--trial-cpus", type=float, default=1.0, help="CPUs Tune gives a trial")
    parser.add_argument("--trials-per-node", type=int, default=0,
                        help="trials a node runs at once (default: local cluster, its CPUs / "
                             "--trial-cpus; else 1)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=1024, help="samples per epoch")
    parser.add_argument("--size", type=int, default=64, help="image side")
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers per loader")
    parser.add_argument("--no-compare", action="store_true",
                        help="skip the sweep where each trial has its own DataLoader")
    args = parser.parse_args()
    if not args.trials_per_node:
        args.trials_per_node = 1 if args.address else max(1, int(args.cpus_per_node // args.trial_cpus))

    cluster = None
    if args.address:
        ray.init(address=args.address)
    else:
        from ray.cluster_utils import Cluster

        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "object_store_memory": 100 * 2**20, "include_dashboard": False})
        for _ in range(args.nodes):
            cluster.add_node(num_cpus=args.cpus_per_node, object_store_memory=100 * 2**20)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
    storage = tempfile.mkdtemp(prefix="batchcast-tune-")
    try:
        shared, wall, producers_cpu = sweep(args, True, storage)
        print_results("trials fed by one batchcast producer per node:", shared)
        own = None
        if not args.no_compare:
            own = sweep(args, False, storage)
            print_results("the same trials, each with its own DataLoader:", own[0])
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()

    trials_cpu = sum(r["cpu"] for r in shared)
    nodes = len({r["node"] for r in shared})
    print(f"\nsweep of {args.trials} trials x {args.epochs} epochs x {args.samples} images "
          f"({args.size}x{args.size}) on {nodes} node(s):")
    cpu = trials_cpu + producers_cpu
    print(f"  one producer per node : wall {wall:7.2f} s   CPU {cpu:7.2f} s "
          f"(trials {trials_cpu:.2f} s, producers and their loaders {producers_cpu:.2f} s)")
    if own is not None:
        own_wall, own_cpu = own[1], sum(r["cpu"] for r in own[0])
        print(f"  a DataLoader each     : wall {own_wall:7.2f} s   CPU {own_cpu:7.2f} s")
        print(f"  saved by sharing      : wall {own_wall - wall:7.2f} s "
              f"({(own_wall - wall) / own_wall:.0%})   CPU {own_cpu - cpu:7.2f} s "
              f"({(own_cpu - cpu) / own_cpu:.0%})")
    if not all(r["exactly_once"] for r in shared):
        sys.exit("a trial missed or repeated samples")


if __name__ == "__main__":
    main()

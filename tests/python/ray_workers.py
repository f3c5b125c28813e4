"""What the Ray tests run on the cluster's nodes: a loader factory and a trial.
Importable by Ray's worker processes (the tests put this folder on their
PYTHONPATH before the cluster starts)."""

from __future__ import annotations

import functools
import os
import signal
from typing import Any

import ray
import torch
from torch.utils.data import DataLoader

from workers import IdDataset, check_values, sample_ids


def make_loader(samples: int, loader_batch: int, seed: int = 0, workers: int = 0) -> DataLoader:
    """The same shuffled order on every node (a fixed seed), as a sweep needs."""
    return DataLoader(IdDataset(samples), batch_size=loader_batch, shuffle=True,
                      generator=torch.Generator().manual_seed(seed), num_workers=workers)


def loader_order(samples: int, loader_batch: int, seed: int = 0) -> list[list[int]]:
    """The ids of each epoch, as a producer over make_loader serves them."""
    loader = make_loader(samples, loader_batch, seed)
    return [[i for _, ids in loader for i in ids.tolist()] for _ in range(4)]


def loader_factory(samples: int, loader_batch: int, seed: int = 0, workers: int = 0):
    return functools.partial(make_loader, samples, loader_batch, seed, workers)


@ray.remote(num_cpus=0.5, max_retries=0)
def trial(name: str, samples: int, loader_batch: int, batch_size: int, epochs: int,
          min_consumers: int = 1, idle_timeout: float | None = 300.0,
          die_after: int = -1, started: Any = None, sleep: float = 0.0,
          producer_epochs: int | None = None, workers: int = 0,
          hold_at: int = -1, consumer_options: dict[str, Any] | None = None,
          cache: str | None = None) -> dict[str, Any]:
    """A trial: the node's stream at its own batch size for `epochs` epochs,
    every value checked. `die_after` >= 0: killed (SIGKILL, by itself) after
    that many batches, holding them. `started`: an actor told of every batch;
    with `hold_at`, after that many batches the trial waits (holding its
    batch) until the test opens `started`'s gate.
    `sleep`: seconds of "training" per batch. `cache`: the producer's
    decoded cache (its option), if it is made here."""
    import time

    import batchcast as bc

    consumer = bc.ray.consumer(name, loader_factory(samples, loader_batch, workers=workers),
                               batch_size=batch_size,
                               idle_timeout=idle_timeout,
                               producer_options={"min_consumers": min_consumers,
                                                 "epochs": producer_epochs, "cache": cache},
                               **(consumer_options or {}))
    got, held = [], []
    length = len(consumer)  # known from the start: the producer has the DataLoader itself
    for _ in range(epochs):
        ids = []
        for batch in consumer:
            check_values(batch)
            ids += sample_ids(batch)
            if started is not None:
                ray.get(started.batch.remote(ray.get_runtime_context().get_node_id()))
                taken = ray.get(started.count.remote(ray.get_runtime_context().get_node_id()))
                while taken == hold_at and not ray.get(started.is_open.remote()):
                    time.sleep(0.02)
            if die_after >= 0:
                held.append(batch)
                if len(held) > die_after:
                    os.kill(os.getpid(), signal.SIGKILL)
            if sleep:
                time.sleep(sleep)
        got.append(ids)
    stats = consumer.stats()
    consumer.close()
    return {"epochs": got, "node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
            "stats": stats, "len": length}


@ray.remote(num_cpus=0)
class Progress:
    """Counts the batches trials took, per node, so a test can wait for it."""

    def __init__(self) -> None:
        self.batches: dict[str, int] = {}

    def batch(self, node_id: str) -> None:
        self.batches[node_id] = self.batches.get(node_id, 0) + 1

    def count(self, node_id: str) -> int:
        return self.batches.get(node_id, 0)

    def open(self) -> None:
        self.gate = True

    def is_open(self) -> bool:
        return getattr(self, "gate", False)

"""Nothing hangs: trainers that keep batches, trainers whose batches span
loader batches, loader batches from 1/4x to 4x the first, rings of 2 to 8
slots, many seeds. Every run ends within a bound; a trainer that keeps no
batch gets every sample of every epoch once; one that keeps batches either
does too or, where its batches and the others' fill the ring so that
nothing can move, is evicted with an error naming `.clone()` (the log says
who held what) — and the others go on.

In one process (threads), to run many configurations in CI.
`BATCHCAST_HANG_SEEDS=200 pytest tests/python/test_no_hang.py` runs more."""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import warnings
from typing import Any

import batchcast as bc
import torch

SEEDS = int(os.environ.get("BATCHCAST_HANG_SEEDS", "42"))
SAMPLES, FIRST, EPOCHS = 400, 8, 2
BOUND = 60.0  # seconds a run may take before it counts as a hang


class Varying:
    """Epochs of SAMPLES samples (x = its id, 16 times) in batches of FIRST,
    then of random sizes from FIRST / 4 to 4 * FIRST."""

    def __init__(self, seed: int) -> None:
        self.seed, self.epoch = seed, 0

    def __iter__(self) -> Any:
        rng = random.Random(self.seed * 1000 + self.epoch)
        self.epoch += 1
        i, first = 0, True
        while i < SAMPLES:
            b = FIRST if first else rng.randint(FIRST // 4, FIRST * 4)
            first = False
            b = min(b, SAMPLES - i)
            ids = torch.arange(i, i + b)
            yield ids.float().view(-1, 1).repeat(1, 16), ids
            i += b


def trainer(name: str, kind: str, batch_size: int, seed: int, out: dict[str, Any],
            keep_from: int = 0) -> None:
    """kind: "plain" keeps nothing; "keeper" keeps some batches and drops some;
    "hoarder" keeps every batch to the end (from its `keep_from`-th on)."""
    rng = random.Random(seed)
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []
    try:
        consumer = bc.Consumer(name, batch_size=batch_size, timeout=30)
        epochs = []
        taken = 0
        for _ in range(EPOCHS):
            ids: list[int] = []
            for x, i in consumer:
                taken += 1
                ids += i.tolist()
                if kind == "keeper" and rng.random() < 0.5:
                    kept.append((x, i))
                if kind == "keeper" and kept and rng.random() < 0.2:
                    kept.pop(rng.randrange(len(kept)))
                if kind == "hoarder" and taken > keep_from:
                    kept.append((x, i))
            epochs.append(ids)
        for x, i in kept:  # what it kept was never overwritten
            assert torch.equal(x[:, 0], i.float()), "a kept batch changed"
        out["epochs"] = epochs
        consumer.close()
    except bc.Evicted as exc:
        out["evicted"] = str(exc)
    except Exception as exc:  # reported, and the test fails on it
        out["error"] = f"{type(exc).__name__}: {exc}"


def run(seed: int, slots: int, caplog: Any) -> dict[str, Any]:
    rng = random.Random(seed)
    name = f"hang-{seed}-{slots}"
    sizes = {"plain": rng.choice([3, 7, 13, 21, 33]), "keeper": rng.randint(1, 40),
             "hoarder": rng.randint(1, 40)}
    producer = bc.Producer(Varying(seed), name, epochs=EPOCHS, slots=slots, min_consumers=3)
    results: dict[str, dict[str, Any]] = {k: {} for k in sizes}
    threads = [threading.Thread(target=trainer, args=(name, k, b, seed * 7 + b, results[k]),
                                daemon=True) for k, b in sizes.items()]
    started = time.monotonic()
    producer.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.1, BOUND - (time.monotonic() - started)))
    took = time.monotonic() - started
    hung = [k for k, t in zip(sizes, threads) if t.is_alive()]
    stats = producer.stats()
    try:
        producer.stop(timeout=10)
    finally:
        for t in threads:
            t.join(10)
    where = f"seed {seed}, slots {slots}, batch sizes {sizes}"
    assert not hung, f"{where}: {hung} still waiting after {BOUND} s; producer: {stats}"
    for kind, res in results.items():
        assert "error" not in res, f"{where}: {kind}: {res['error']}"
        if "evicted" in res:
            assert kind != "plain", f"{where}: a trainer keeping nothing was evicted: {res}"
            assert ".clone()" in res["evicted"] and f"slots={slots}" in res["evicted"], res
            continue
        assert [sorted(e) for e in res["epochs"]] == [list(range(SAMPLES))] * EPOCHS, \
            f"{where}: {kind} did not get every sample once"
    evicted = [k for k, r in results.items() if "evicted" in r]
    if evicted:
        said = [r.getMessage() for r in caplog.records if "cannot go on" in r.getMessage()]
        assert said and "holds" in said[0], caplog.text
    caplog.clear()
    return {"took": took, "evicted": evicted}


def test_keepers_and_spanning_batches_never_hang(runtime_dir, caplog):
    caplog.set_level(logging.WARNING, logger="batchcast")
    warnings.simplefilter("ignore", bc.BatchcastWarning)  # KeptBatches: expected here
    outcomes = []
    for seed in range(SEEDS):
        slots = 2 + seed % 7
        outcomes.append((slots, run(seed, slots, caplog)))
    longest = max(o["took"] for _, o in outcomes)
    evictions = sum(len(o["evicted"]) for _, o in outcomes)
    print(f"\n{len(outcomes)} runs (slots 2-8), longest {longest:.1f} s, "
          f"{evictions} keepers evicted in {sum(bool(o['evicted']) for _, o in outcomes)} runs")
    assert longest < BOUND


def test_keepers_that_leave_the_ring_no_room_are_evicted_and_the_others_go_on(runtime_dir, caplog):
    """24 trainers of a 2-slot ring that each start keeping every batch at
    another place in the stream: each pins two batches before it is noticed
    keeping, together more than the ring's room for kept batches. Nothing
    can move; the producer says who holds what, evicts the keepers naming
    the fix, and the trainer that keeps nothing gets every sample of both
    epochs."""
    caplog.set_level(logging.WARNING, logger="batchcast")
    warnings.simplefilter("ignore", bc.BatchcastWarning)
    name = "hang-keepers"
    producer = bc.Producer(Varying(1), name, epochs=EPOCHS, slots=2, min_consumers=25)
    kinds = {"plain": ("plain", 0), **{f"hoarder{k}": ("hoarder", 3 * k) for k in range(24)}}
    results: dict[str, dict[str, Any]] = {k: {} for k in kinds}
    threads = [threading.Thread(target=trainer, args=(name, kind, 8, k, results[key], start),
                                daemon=True)
               for k, (key, (kind, start)) in enumerate(kinds.items())]
    producer.start()
    for t in threads:
        t.start()
    started = time.monotonic()
    for t in threads:
        t.join(max(0.1, BOUND - (time.monotonic() - started)))
    stats = producer.stats()
    producer.stop(timeout=10)
    assert not any(t.is_alive() for t in threads), f"still waiting after {BOUND} s: {stats}"
    assert [sorted(e) for e in results["plain"]["epochs"]] == [list(range(SAMPLES))] * EPOCHS
    evicted = [k for k, r in results.items() if "evicted" in r]
    assert evicted and "plain" not in evicted, results
    for key in evicted:
        message = results[key]["evicted"]
        assert "keeps" in message and ".clone()" in message and "slots=2" in message, message
    said = [r.getMessage() for r in caplog.records if "cannot go on" in r.getMessage()]
    assert said and "holds" in said[0] and "of batches it keeps" in said[0], caplog.text
    assert stats["evictions"] == len(evicted)

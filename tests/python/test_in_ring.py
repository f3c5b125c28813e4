"""Loader workers write their batches straight into the ring (no copy in the
producer), and everything that cannot go that way takes the one copy,
counted: the samples, their order and values, and the producer's counters."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import batchcast as bc
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

HERE = Path(__file__).parent
Pair = namedtuple("Pair", ["image", "label"])


class Samples(Dataset):
    """Sample i: an image filled with i, its label i, its name. From sample
    `grow_at` on, images are wider than the first batch's."""

    def __init__(self, n: int, grow_at: int | None = None, kill_at: int | None = None):
        self.n, self.grow_at, self.kill_at = n, grow_at, kill_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.kill_at is not None and i == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # this loader worker dies
        width = 4 if self.grow_at is None or i < self.grow_at else 6
        return {"pair": Pair(torch.full((3, width), float(i)), i), "name": f"s{i}",
                "weight": float(i) / 2}


def serve(loader, name, *, batch_size, epochs=2, **options):
    """Serves `loader` for `epochs` to one consumer; returns what the consumer
    saw per epoch (ids in order) and the producer's stats."""
    epochs_seen = []
    with bc.Producer(loader, name, epochs=epochs, **options) as producer:
        with bc.Consumer(name, batch_size=batch_size, timeout=30) as consumer:
            for _ in range(epochs):
                ids = []
                for batch in consumer:
                    images, labels = batch["pair"]
                    assert isinstance(batch["pair"], Pair)
                    width = images.shape[2]
                    assert torch.equal(images, labels.float().view(-1, 1, 1).expand(-1, 3, width))
                    assert batch["name"] == [f"s{i}" for i in labels.tolist()]
                    assert torch.equal(batch["weight"], labels.double() / 2)
                    ids += labels.tolist()
                epochs_seen.append(ids)
            consumer_stats = consumer.stats()
    return epochs_seen, producer.stats(), consumer_stats


def first_copies(loader) -> int:
    """Batches the loader dispatches before the first is published (the ring
    does not exist yet, so they take the copy)."""
    return loader.num_workers * loader.prefetch_factor + 1


@pytest.mark.every_torch
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("batch_size", [32, 48])
def test_loader_workers_write_every_batch_into_the_ring_after_the_first(runtime_dir, name,
                                                                         persistent, batch_size):
    loader = DataLoader(Samples(1003), batch_size=32, num_workers=2, persistent_workers=persistent)
    per_epoch = -(-1003 // 32)
    seen, stats, _ = serve(loader, name, batch_size=batch_size)
    assert seen == [list(range(1003))] * 2
    assert stats["batches_published"] == 2 * per_epoch
    # Only the batches asked of the workers before the ring existed were copied.
    assert stats["batches_in_place"] == 2 * per_epoch - first_copies(loader), stats
    per_batch = 32 * (3 * 4 * 4 + 8 + 8)  # images (float32), labels (int64), weights (double)
    assert stats["bytes_copied"] == first_copies(loader) * per_batch, stats
    assert stats["leases_out"] == 0
    # The loader is handed back as it was given.
    assert loader.collate_fn is default_collate
    assert type(loader.batch_sampler).__name__ == "BatchSampler"


@pytest.mark.parametrize("persistent", [False, True])
def test_in_place_batches_lie_back_to_back_so_a_consumer_batch_spanning_them_is_one_view(
        runtime_dir, name, persistent):
    # Every consumer batch of 48 spans two loader batches of 32. In a ring
    # that holds both epochs without wrapping, the copied first batches and
    # the in-place ones after them lie back to back, so no consumer batch is
    # a copy. (Where a ring wraps, and where a consumer lagging by more than
    # `slots` batches sends the flow into the room kept for kept batches, a
    # spanning consumer batch is copied: how often depends on the timing, so
    # the wrapping ring's copies are not counted here.)
    loader = DataLoader(Samples(1003), batch_size=32, num_workers=2, persistent_workers=persistent)
    seen, stats, consumer = serve(loader, name, batch_size=48, slots=64)
    assert seen == [list(range(1003))] * 2
    assert stats["batches_in_place"] == 2 * -(-1003 // 32) - first_copies(loader), stats
    assert consumer["batches"] == 2 * -(-1003 // 48)
    assert consumer["copies"] == 0, consumer
    assert consumer["views"] == 3 * consumer["batches"], consumer


def test_spawned_workers_write_into_the_ring_too(runtime_dir, name):
    # Spawned workers get the collate and each batch's lease by pickling, and
    # reopen the ring through /proc themselves.
    loader = DataLoader(Samples(200), batch_size=20, num_workers=2, multiprocessing_context="spawn")
    seen, stats, _ = serve(loader, name, batch_size=30)
    assert seen == [list(range(200))] * 2
    assert stats["batches_in_place"] == stats["batches_published"] - first_copies(loader)


def test_a_shuffled_loader_arrives_in_its_own_order(runtime_dir, name):
    def loader():
        return DataLoader(Samples(300), batch_size=16, shuffle=True, num_workers=2,
                          generator=torch.Generator().manual_seed(7))

    reference = loader()
    want = [[int(i) for b in reference for i in b["pair"].label] for _ in range(2)]
    seen, stats, _ = serve(loader(), name, batch_size=20)
    assert seen == want
    assert stats["batches_in_place"] > 0


def test_a_collate_of_ones_own_wrapped_in_batchcast_collate_writes_into_the_ring(runtime_dir, name):
    def mine(samples):
        out = default_collate(samples)
        out["name"] = [s.upper().lower() for s in out["name"]]
        return out

    loader = DataLoader(Samples(200), batch_size=25, num_workers=2, collate_fn=bc.collate(mine))
    seen, stats, _ = serve(loader, name, batch_size=30)
    assert seen == [list(range(200))] * 2
    assert stats["batches_in_place"] == stats["batches_published"] - first_copies(loader)
    assert isinstance(loader.collate_fn, bc.collate)


def test_batchcast_collate_outside_a_producer_is_the_collate_it_wraps():
    samples = [Samples(4)[i] for i in range(4)]
    for ours, theirs in ((bc.collate(), default_collate), (bc.collate(default_collate), default_collate)):
        a, b = ours(samples), theirs(samples)
        assert torch.equal(a["pair"].image, b["pair"].image)
        assert a["name"] == b["name"]
    with pytest.raises(TypeError, match="wraps a collate function"):
        bc.collate(3)


def own_tensors(samples):
    return default_collate(samples)  # not wrapped: its tensors are its own


class Batches:
    """Not a DataLoader: an iterable of ready batches."""

    def __iter__(self):
        yield from DataLoader(Samples(100), batch_size=10)


@pytest.mark.parametrize("case", ["own collate", "no workers", "not a DataLoader"])
def test_what_cannot_be_written_in_place_takes_one_copy_counted(runtime_dir, name, case):
    loader = {
        "own collate": lambda: DataLoader(Samples(100), batch_size=10, num_workers=2,
                                          collate_fn=own_tensors),
        "no workers": lambda: DataLoader(Samples(100), batch_size=10),
        "not a DataLoader": Batches,
    }[case]()
    seen, stats, _ = serve(loader, name, batch_size=7)
    assert seen == [list(range(100))] * 2
    assert stats["batches_in_place"] == 0
    assert stats["bytes_copied"] == stats["bytes_published"] > 0


def test_a_batch_larger_than_the_first_is_collated_as_usual_and_copied(runtime_dir, name):
    # Samples from 192 on are wider: their batches (12..15) do not fit the
    # slots leased for batches like the first; their workers collate them as usual.
    loader = DataLoader(Samples(256, grow_at=192), batch_size=16, num_workers=2)
    seen, stats, _ = serve(loader, name, batch_size=16, epochs=1)
    assert seen == [list(range(256))]
    assert stats["batches_in_place"] == 12 - first_copies(loader), stats
    narrow, wide = 16 * (3 * 4 * 4 + 16), 16 * (3 * 6 * 4 + 16)
    assert stats["bytes_copied"] == first_copies(loader) * narrow + 4 * wide, stats
    assert stats["leases_out"] == 0
    assert stats["leases_returned"] == 4, stats  # the wide batches' leases came back unused


PRODUCER = """
import sys
sys.path.insert(0, {here!r})
from torch.utils.data import DataLoader
import batchcast as bc
from test_in_ring import Samples
loader = DataLoader(Samples(400, kill_at=300), batch_size=10, num_workers=2)
bc.Producer(loader, {name!r}, epochs=1).run()
"""


def test_a_killed_loader_worker_reaches_the_consumers_as_a_loader_error(runtime_dir, name):
    # The producer in a process of its own: DataLoader tells its process of a
    # dead worker with a SIGCHLD handler, which would interrupt this test.
    producer = subprocess.Popen([sys.executable, "-c", PRODUCER.format(here=str(HERE), name=name)],
                                stderr=subprocess.PIPE, text=True)
    try:
        consumer = bc.Consumer(name, batch_size=10, timeout=30)
        got = []
        with pytest.raises(bc.LoaderError, match="worker"):
            for batch in consumer:
                got += batch["pair"].label.tolist()
        assert got == list(range(len(got))) and len(got) <= 300
        consumer.close()
        _, err = producer.communicate(timeout=60)
        # "... exited unexpectedly" or "... is killed by signal: Killed."
        assert producer.returncode == 1 and "RuntimeError: DataLoader worker" in err, err
    finally:
        producer.kill()

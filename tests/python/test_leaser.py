"""The Python side of in-place batches, in-process: the Leaser's bookkeeping,
the RingWriter that travels with a batch's indices, the dataset wrapper that
hands it to the collate, and `collate` — against a stand-in for the
producer's core whose ring is a real memfd, so every byte a writer puts there
can be read back."""

from __future__ import annotations

import mmap
import os
import pickle
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

from batchcast._in_ring import (Declined, LeasedIndices, Leaser, RingWriter, Samples,
                                WritingDataset, collate)


class Ids(Dataset):  # type: ignore[type-arg]
    """Sample i: (tensor([i, -i]), i * 10)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.label = "ids"

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return torch.tensor([i, -i]), i * 10


class FakeCore:
    """What the Leaser asks of the producer's core: leases of `slot_bytes` per
    tensor leaf in a memfd (none before `ready_after` leases were asked for,
    as before the ring exists), return_lease, host_ring."""

    def __init__(self, leaves: int, slot_bytes: int, slots: int = 64, ready_after: int = 0) -> None:
        self.leaves, self.slot_bytes, self.slots = leaves, slot_bytes, slots
        self.ring_bytes = leaves * slot_bytes * slots
        self.fd = os.memfd_create("batchcast-test-leaser", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.ring_bytes)
        self.asked = 0
        self.ready_after = ready_after
        self.next = 0
        self.out: dict[int, list[int]] = {}  # seq -> offsets
        self.returned: list[int] = []

    def lease(self, limit: int) -> tuple[int, int, int, list[int], list[int]] | None:
        self.asked += 1
        if self.asked <= self.ready_after or len(self.out) >= limit:
            return None
        seq, self.next = self.next + 1, self.next + 1
        slot = (seq - 1) % self.slots
        offsets = [(leaf * self.slots + slot) * self.slot_bytes for leaf in range(self.leaves)]
        self.out[seq] = offsets
        return seq, self.fd, self.ring_bytes, offsets, [self.slot_bytes] * self.leaves

    def return_lease(self, seq: int) -> None:
        self.returned.append(seq)
        del self.out[seq]

    def lease_out(self, seq: int) -> bool:
        return seq in self.out

    def return_leases(self) -> int:
        seqs = sorted(self.out)
        for seq in seqs:
            self.return_lease(seq)
        return len(seqs)

    def published(self, seq: int) -> None:  # what publish(..., lease=seq) does to the lease
        del self.out[seq]

    def host_ring(self) -> torch.Tensor:
        return torch.frombuffer(mmap.mmap(self.fd, self.ring_bytes), dtype=torch.uint8)


def serve(loader: DataLoader, core: FakeCore, limit: int = 8) -> tuple[list[Any], Leaser]:
    """One epoch as the producer serves it: [(batch, lease, in_place)]."""
    leaser = Leaser(loader, core, limit)
    got = []
    for batch in loader:
        batch, seq, in_place = leaser.unpack(batch)
        if seq is not None:
            core.published(seq)
        got.append((batch, seq, in_place))
        leaser.published()
    leaser.epoch_done()
    return got, leaser


def lies_at(t: torch.Tensor, ring: torch.Tensor, offset: int) -> bool:
    return t.data_ptr() == ring.data_ptr() + offset


@pytest.mark.parametrize("workers", [0, 2])
def test_every_batch_is_written_where_its_lease_says_and_read_back_intact(workers):
    core = FakeCore(leaves=2, slot_bytes=4 * 2 * 8)
    loader = DataLoader(Ids(20), batch_size=4, num_workers=workers)
    got, leaser = serve(loader, core)
    ring = leaser._ring
    assert ring is not None
    assert len(got) == 5
    for k, (batch, seq, in_place) in enumerate(got):
        ids = torch.arange(4 * k, 4 * k + 4)
        assert in_place and seq == k + 1
        assert torch.equal(batch[0], torch.stack([ids, -ids], 1))
        assert torch.equal(batch[1], ids * 10)
        # Views of the producer's own mapping, at the lease's offsets.
        assert lies_at(batch[0], ring, (0 * 64 + k) * 64) and lies_at(batch[1], ring, (1 * 64 + k) * 64)
    assert core.out == {} and core.returned == []


def test_batches_asked_for_before_the_ring_existed_are_copied_into_slots_leased_for_them_in_order():
    core = FakeCore(leaves=2, slot_bytes=64, ready_after=3)  # the first three asks find no ring
    leaser = Leaser(DataLoader(Ids(24), batch_size=4, num_workers=0), core, 8)
    # Three batches asked of the workers before the first is back: no leases.
    assert [leaser.take() for _ in range(3)] == [None, None, None]
    plain = [default_collate([Ids(24)[i] for i in range(4 * k, 4 * k + 4)]) for k in range(3)]
    batch, seq, in_place = leaser.unpack(plain[0])
    assert seq is None and not in_place and batch is plain[0]
    leaser.published()  # the ring exists now: the two still coming get slots, in order
    assert list(leaser.for_copies) == [1, 2]
    assert [leaser.unpack(b)[1:] for b in plain[1:]] == [(1, False), (2, False)]  # copied into them
    leaser.published()  # once only
    assert list(leaser.for_copies) == [] and leaser.unleased == 0


def test_a_batch_larger_than_its_lease_is_declined_collated_as_usual_and_its_lease_goes_back():
    core = FakeCore(leaves=2, slot_bytes=3 * 2 * 8)  # room for 3 samples, batches of 4
    loader = DataLoader(Ids(8), batch_size=4, num_workers=0)
    leaser = Leaser(loader, core, 8)
    for k, raw in enumerate(loader):
        assert isinstance(raw, Declined)
        batch, seq, in_place = leaser.unpack(raw)
        assert seq is None and not in_place
        ids = torch.arange(4 * k, 4 * k + 4)
        assert torch.equal(batch[1], ids * 10)
    assert core.returned == [1, 2] and core.out == {}


def test_leases_whose_batches_never_came_back_go_back_at_the_epochs_end():
    core = FakeCore(leaves=1, slot_bytes=64)
    loader = DataLoader(Ids(8), batch_size=4, num_workers=0)
    leaser = Leaser(loader, core, 8)
    writers = [leaser.take() for _ in range(3)]  # asked for; their workers died
    assert [w.seq for w in writers if w is not None] == [1, 2, 3]
    leaser.epoch_done()
    assert core.returned == [1, 2, 3] and core.out == {}


def test_at_most_limit_leases_are_out_and_the_rest_is_copied():
    core = FakeCore(leaves=1, slot_bytes=64)
    leaser = Leaser(DataLoader(Ids(8), batch_size=4, num_workers=0), core, 2)
    assert [w is not None for w in (leaser.take(), leaser.take(), leaser.take())] == [True, True, False]


def test_the_writer_travels_with_the_indices_and_reaches_the_collate_with_the_samples():
    writer = RingWriter(os.getpid(), 3, 4096, 7, [0], [64])
    indices = LeasedIndices([5, 6])
    indices.writer = writer
    arrived = pickle.loads(pickle.dumps(indices))  # as a worker receives them
    assert list(arrived) == [5, 6] and arrived.writer == writer
    fetched = WritingDataset(Ids(10)).__getitems__(arrived)
    assert isinstance(fetched, Samples) and fetched.writer == writer
    assert [s[1] for s in fetched] == [50, 60]
    # Indices without a writer (no lease): plain samples, plainly collated.
    plain = WritingDataset(Ids(10)).__getitems__([1, 2])
    assert type(plain) is list
    assert torch.equal(collate()(plain)[1], torch.tensor([10, 20]))


def test_the_dataset_wrapper_is_the_dataset_for_everything_else():
    class WithItems(Ids):
        def __getitems__(self, indices: list[int]) -> list[Any]:
            self.fetched = list(indices)
            return [self[i] for i in indices]

    inner = WithItems(10)
    wrapped = WritingDataset(inner)
    assert len(wrapped) == 10 and wrapped.label == "ids" and wrapped[3][1] == 30
    wrapped.__getitems__([4, 2])
    assert inner.fetched == [4, 2]  # the dataset's own batch fetch is used
    with pytest.raises(AttributeError):
        wrapped.nothing_here  # noqa: B018
    assert pickle.loads(pickle.dumps(WritingDataset(Ids(10)))).dataset.n == 10  # to spawned workers


def test_restore_gives_the_loader_back_as_it_was():
    loader = DataLoader(Ids(8), batch_size=4, num_workers=2)
    dataset, sampler, fn = loader.dataset, loader.batch_sampler, loader.collate_fn
    assert Leaser.applies(loader)
    leaser = Leaser(loader, FakeCore(leaves=2, slot_bytes=64), 8)
    assert isinstance(loader.dataset, WritingDataset) and isinstance(loader.collate_fn, collate)
    assert len(loader) == 2
    leaser.restore()
    assert loader.dataset is dataset and loader.batch_sampler is sampler and loader.collate_fn is fn
    assert fn is default_collate


def test_an_iterable_dataset_is_not_leased():
    class Stream(IterableDataset):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            return iter(range(8))

    assert not Leaser.applies(DataLoader(Stream(), batch_size=4, num_workers=2))
    assert Leaser.applies(DataLoader(Ids(8), batch_size=4, num_workers=2))


def test_a_collate_of_ones_own_is_committed_into_the_ring():
    core = FakeCore(leaves=1, slot_bytes=64)
    loader = DataLoader(Ids(8), batch_size=4, num_workers=0,
                        collate_fn=collate(lambda s: torch.stack([x[0] for x in s]) * 3))
    got, leaser = serve(loader, core)
    assert [in_place for _, _, in_place in got] == [True, True]
    assert torch.equal(got[1][0], torch.stack([torch.arange(4, 8), -torch.arange(4, 8)], 1) * 3)

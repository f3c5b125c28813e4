"""The Python side of in-place batches, in-process: the Leaser's bookkeeping,
the RingWriter that travels with a batch's indices, the dataset wrapper that
hands it to the collate, and `collate` — against the producer's real core
(batchcast._C.Producer, nobody connected): its ring is a real memfd, so every
byte a writer puts there can be read back, and which leases are out is what
its slot ledger says (core.lease_out, core.stats()), never a copy kept here."""

from __future__ import annotations

import os
import pickle
from typing import Any, NamedTuple

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

from batchcast import _in_ring
from batchcast._core import _C
from batchcast._in_ring import (Declined, LeasedIndices, Leaser, RingWriter, Samples,
                                WritingDataset, collate)
from batchcast._structure import flatten_after
from conftest import eventually


class Ids(Dataset):  # type: ignore[type-arg]
    """Sample i: (tensor([i, -i]), i * 10)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.label = "ids"

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return torch.tensor([i, -i]), i * 10


def ids_batch(first: int, n: int) -> Any:
    """Samples first..first+n-1 of Ids, collated as usual."""
    return default_collate([Ids(first + n)[i] for i in range(first, first + n)])


@pytest.fixture
def core(runtime_dir, name):
    """The producer's core, serving epoch 0, with no consumer. With nobody
    connected a published batch's slot is freed as soon as the core has sent
    it to nobody (catch_up_window=0: no batch is kept for consumers that join
    later), so the ring never fills and a lease never waits for room."""
    made = _C.Producer(name=name, catch_up_window=0)
    try:
        made.begin_epoch(0)
        yield made
    finally:
        made.close()
        _in_ring._rings.clear()  # a workers=0 loader mapped the ring in this process
    assert list(runtime_dir.iterdir()) == []  # nothing left behind


def publish(core: Any, batch: Any, lease: int | None = None, in_place: bool = False,
            tree: list[Any] | None = None) -> list[Any]:
    """As the Producer publishes a loader batch; returns its structure."""
    leaves, layout, samples, tree = flatten_after(batch, tree)
    core.publish(leaves, layout, samples, lease, in_place)
    return tree


def counts(core: Any) -> dict[str, int]:
    stats = core.stats()
    return {k: stats[k] for k in ("leases_out", "leases_returned", "batches_in_place")}


class Recording(Leaser):
    """The Leaser, noting each writer it hands out (they leave with the
    indices for the workers, where the test cannot see them)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.writers: dict[int, RingWriter] = {}

    def take(self) -> RingWriter | None:
        writer = super().take()
        if writer is not None:
            self.writers[writer.seq] = writer
        return writer


def offset_in(ring: torch.Tensor | None, t: torch.Tensor) -> int | None:
    """Where `t` lies in the producer's mapping of the ring; None: elsewhere."""
    if ring is None or not ring.data_ptr() <= t.data_ptr() < ring.data_ptr() + ring.numel():
        return None
    return t.data_ptr() - ring.data_ptr()


class Served(NamedTuple):
    batch: Any              # a copy, made before publishing (its slot is reused after)
    seq: int | None         # its lease
    in_place: bool
    at: list[int | None]    # each tensor's offset in the producer's mapping of the ring


def serve(loader: DataLoader, core: Any, limit: int = 8) -> tuple[list[Served], Recording]:
    """One epoch as the producer serves it."""
    leaser = Recording(loader, core, limit)
    ring = core.host_ring()
    got, tree = [], None
    for raw in loader:
        batch, seq, in_place = leaser.unpack(raw)
        leaves = flatten_after(batch, tree)[0]
        at = [offset_in(ring, t) for t in leaves if isinstance(t, torch.Tensor)]
        copy = _in_ring._map_leaves(
            batch, lambda x: x.clone() if isinstance(x, torch.Tensor) else _in_ring._NOT_A_LEAF)
        # (the core checks that a batch said to be in place lies in its lease)
        tree = publish(core, batch, seq, in_place, tree)
        got.append(Served(copy, seq, in_place, at))
        del batch, leaves
        leaser.published()
    leaser.epoch_done()
    return got, leaser


@pytest.mark.parametrize("workers", [0, 2])
def test_every_batch_is_written_where_its_lease_says_and_read_back_intact(core, workers):
    publish(core, ids_batch(100, 4))  # the first batch makes the ring; the loader's all get leases
    loader = DataLoader(Ids(20), batch_size=4, num_workers=workers)
    got, leaser = serve(loader, core)
    assert len(got) == 5
    first = got[0].seq
    assert first is not None
    for k, (batch, seq, in_place, at) in enumerate(got):
        ids = torch.arange(4 * k, 4 * k + 4)
        assert in_place and seq == first + k  # leased in the loader's order
        assert torch.equal(batch[0], torch.stack([ids, -ids], 1))
        assert torch.equal(batch[1], ids * 10)
        # Views of the producer's own mapping, at the lease's offsets.
        assert at == leaser.writers[seq].offsets
    # The ledger: every lease used in place, none out, none gone back unused.
    assert not any(core.lease_out(s.seq) for s in got)
    assert counts(core) == {"leases_out": 0, "leases_returned": 0, "batches_in_place": 5}
    assert core.stats()["bytes_copied"] == 4 * 2 * 8 + 4 * 8  # the first batch only
    eventually(lambda: core.stats()["slots_in_use"] == 0, "every slot freed")


def test_batches_asked_for_before_the_ring_existed_are_copied_into_slots_leased_for_them_in_order(core):
    leaser = Leaser(DataLoader(Ids(24), batch_size=4, num_workers=0), core, 8)
    # Three batches asked of the workers before the first is back: there is
    # no ring before the first publish, so no leases.
    assert [leaser.take() for _ in range(3)] == [None, None, None]
    assert counts(core)["leases_out"] == 0
    plain = [ids_batch(4 * k, 4) for k in range(3)]
    batch, seq, in_place = leaser.unpack(plain[0])
    assert seq is None and not in_place and batch is plain[0]
    tree = publish(core, batch)  # makes the ring
    leaser.published()  # the ring exists now: the two still coming get slots, in order
    slots = list(leaser.for_copies)
    assert len(slots) == 2 and slots[0] < slots[1]
    assert all(core.lease_out(s) for s in slots) and counts(core)["leases_out"] == 2
    for b, slot in zip(plain[1:], slots):
        batch, seq, in_place = leaser.unpack(b)
        assert (seq, in_place) == (slot, False)
        tree = publish(core, batch, seq, in_place, tree)  # copied into it
        assert not core.lease_out(slot)
        leaser.published()  # once only
    # Both leases were used by the copies (one that could not take its batch would go back).
    assert counts(core) == {"leases_out": 0, "leases_returned": 0, "batches_in_place": 0}
    assert list(leaser.for_copies) == [] and leaser.unleased == 0
    eventually(lambda: core.stats()["slots_in_use"] == 0, "every slot freed")


def test_a_batch_larger_than_its_lease_is_declined_collated_as_usual_and_its_lease_goes_back(core):
    publish(core, ids_batch(100, 3))  # leases have room for what the first batch took: 3 samples
    loader = DataLoader(Ids(8), batch_size=4, num_workers=0)
    leaser = Leaser(loader, core, 8)
    declined = []
    for k, raw in enumerate(loader):
        assert isinstance(raw, Declined)
        assert core.lease_out(raw.seq)  # out until the producer hears of it
        declined.append(raw.seq)
        batch, seq, in_place = leaser.unpack(raw)
        assert seq is None and not in_place
        assert not core.lease_out(raw.seq)  # back
        ids = torch.arange(4 * k, 4 * k + 4)
        assert torch.equal(batch[1], ids * 10)
        publish(core, batch)  # the producer's one copy
        leaser.published()
    leaser.epoch_done()
    assert len(set(declined)) == 2
    assert counts(core) == {"leases_out": 0, "leases_returned": 2, "batches_in_place": 0}


def test_leases_whose_batches_never_came_back_go_back_at_the_epochs_end(core):
    publish(core, ids_batch(100, 4))
    loader = DataLoader(Ids(8), batch_size=4, num_workers=0)
    leaser = Leaser(loader, core, 8)
    writers = [leaser.take() for _ in range(3)]  # asked for; their workers died
    seqs = [w.seq for w in writers if w is not None]
    assert len(set(seqs)) == 3 and all(core.lease_out(s) for s in seqs)
    assert counts(core)["leases_out"] == 3
    leaser.epoch_done()
    assert not any(core.lease_out(s) for s in seqs)
    assert counts(core) == {"leases_out": 0, "leases_returned": 3, "batches_in_place": 0}
    eventually(lambda: core.stats()["slots_in_use"] == 0, "every slot freed")


def test_at_most_limit_leases_are_out_and_the_rest_is_copied(core):
    publish(core, ids_batch(100, 4))
    leaser = Leaser(DataLoader(Ids(8), batch_size=4, num_workers=0), core, 2)
    taken = [leaser.take(), leaser.take(), leaser.take()]
    assert [w is not None for w in taken] == [True, True, False]
    assert counts(core)["leases_out"] == 2
    # The limit counts what the ledger says is out: one back, one more.
    assert taken[0] is not None
    core.return_lease(taken[0].seq)
    assert leaser.take() is not None and counts(core)["leases_out"] == 2


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


def test_restore_gives_the_loader_back_as_it_was(core):
    loader = DataLoader(Ids(8), batch_size=4, num_workers=2)
    dataset, sampler, fn = loader.dataset, loader.batch_sampler, loader.collate_fn
    assert Leaser.applies(loader)
    leaser = Leaser(loader, core, 8)
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


def test_a_collate_of_ones_own_is_committed_into_the_ring(core):
    publish(core, torch.zeros(4, 2, dtype=torch.long))  # what the collate makes: the ring
    loader = DataLoader(Ids(8), batch_size=4, num_workers=0,
                        collate_fn=collate(lambda s: torch.stack([x[0] for x in s]) * 3))
    got, leaser = serve(loader, core)
    assert [s.in_place for s in got] == [True, True]
    for s in got:
        assert s.seq is not None and s.at == leaser.writers[s.seq].offsets
    assert torch.equal(got[1].batch, torch.stack([torch.arange(4, 8), -torch.arange(4, 8)], 1) * 3)
    assert counts(core) == {"leases_out": 0, "leases_returned": 0, "batches_in_place": 2}

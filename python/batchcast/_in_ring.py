"""Loader workers write their batches straight into the ring: no host copy.

The producer reserves a ring slot (a *lease*) for each batch its DataLoader
hands to a worker, and a `RingWriter` for that lease travels with the batch's
indices (an attribute of the index list). The loader's dataset is wrapped so
that fetching a batch's samples passes the writer on with them
(`__getitems__`), and `collate` asks it to `commit` the batch: it stacks the
samples straight into the slot and returns a small description of what it
wrote (`InRing`), or says it did not (`Declined`, the batch collated as usual).
The producer turns an `InRing` back into views of its own mapping of the ring
and publishes it saying it is in place: nothing is copied. For a GPU ring the
slot is in the ring's pinned host mirror (same offsets), and the producer's
one host-to-device copy goes from there. Whatever cannot go that way (no
lease, a batch larger than the first, a collate that returns something else)
takes the producer's one copy: `Producer.stats()` counts `batches_in_place`
and `bytes_copied`.
"""

from __future__ import annotations

import collections
import mmap
import os
import warnings
from typing import Any, Callable, Iterator, NamedTuple

import torch

from ._core import _C
from ._sampler import WrappedBatchSampler

# This worker's mapping of the ring it writes into, by (producer pid, fd,
# inode, size): a cache, so that each batch does not map it again.
_rings: dict[tuple[int, int, int, int], torch.Tensor] = {}


class RingTensor(NamedTuple):
    """What a worker returns in place of a tensor it wrote into the ring."""

    offset: int
    shape: tuple[int, ...]
    dtype: torch.dtype


class InRing(NamedTuple):
    """A batch a worker wrote into its lease (tensors as RingTensor)."""

    seq: int
    batch: Any


class Declined(NamedTuple):
    """A batch collated as usual although it had a lease (which goes back)."""

    seq: int
    batch: Any


class _DoesNotFit(Exception):
    pass


def nbytes_of(t: RingTensor) -> int:
    n = t.dtype.itemsize
    for size in t.shape:
        n *= size
    return n


def view_of(ring: torch.Tensor, t: RingTensor) -> torch.Tensor:
    return ring[t.offset:t.offset + nbytes_of(t)].view(t.dtype).view(t.shape)


_NOT_A_LEAF = object()


def _map_leaves(node: Any, leaf: Callable[[Any], Any]) -> Any:
    """`node` rebuilt with leaf(x) for each x that leaf takes (it returns
    _NOT_A_LEAF for the rest), visiting what the producer lists as a batch's
    leaves in its order (see _structure.flatten)."""
    done = leaf(node)
    if done is not _NOT_A_LEAF:
        return done
    if isinstance(node, dict):
        values = {k: _map_leaves(v, leaf) for k, v in node.items()}
        if type(node) is dict:
            return values
        try:
            return type(node)(values)
        except TypeError:
            return values
    if isinstance(node, tuple) and hasattr(node, "_fields"):
        return type(node)(*(_map_leaves(v, leaf) for v in node))
    if type(node) in (list, tuple):
        return type(node)(_map_leaves(v, leaf) for v in node)
    return node


def _ring(lease: "RingWriter") -> torch.Tensor:
    path = f"/proc/{lease.pid}/fd/{lease.fd}"
    # By the memory's identity too: a later ring may get the same fd number.
    key = (lease.pid, lease.fd, os.stat(path).st_ino, lease.ring_bytes)
    ring = _rings.get(key)
    if ring is None:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            memory = mmap.mmap(fd, lease.ring_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        _rings.clear()  # a worker writes into one ring at a time
        ring = torch.frombuffer(memory, dtype=torch.uint8)  # keeps the mapping alive
        _rings[key] = ring
    return ring


class _SlotWriter:
    """Hands out the lease's places, one per tensor leaf, in the batch's order."""

    def __init__(self, lease: "RingWriter") -> None:
        self.lease = lease
        self.ring = _ring(lease)
        self.lane = 0

    def place(self, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, RingTensor]:
        lane = self.lane
        if lane >= len(self.lease.offsets):
            raise _DoesNotFit("more tensors than the first batch")
        placed = RingTensor(self.lease.offsets[lane], tuple(shape), dtype)
        if nbytes_of(placed) > self.lease.bytes[lane] or placed.offset % dtype.itemsize != 0:
            raise _DoesNotFit("larger than the first batch")
        self.lane += 1
        return view_of(self.ring, placed), placed

    def stack(self, batch: list[torch.Tensor], *, collate_fn_map: Any = None) -> RingTensor:
        elem = batch[0]
        if elem.is_nested or elem.layout != torch.strided or elem.is_sparse:
            raise _DoesNotFit("not a dense tensor")
        view, placed = self.place((len(batch), *elem.shape), elem.dtype)
        torch.stack(batch, 0, out=view)
        return placed

    def copy(self, tensor: torch.Tensor) -> RingTensor:
        view, placed = self.place(tuple(tensor.shape), tensor.dtype)
        view.copy_(tensor)
        return placed


def _default_into(writer: _SlotWriter, samples: list[Any]) -> Any:
    """torch's default_collate, with every tensor it makes written into the ring."""
    from torch.utils.data._utils import collate as torch_collate

    def into_ring(made: Callable[..., Any]) -> Callable[..., Any]:
        # numbers and numpy scalars: default_collate makes a small tensor of them
        def collate_into(batch: Any, *, collate_fn_map: Any = None) -> Any:
            out = made(batch, collate_fn_map=collate_fn_map)
            return writer.copy(out) if isinstance(out, torch.Tensor) and out.dim() > 0 else out
        return collate_into

    fn_map: dict[Any, Callable[..., Any]] = {
        kind: into_ring(made) for kind, made in torch_collate.default_collate_fn_map.items()}
    # (numpy arrays become tensors and are collated again with this map: stacked)
    fn_map[torch.Tensor] = writer.stack
    return torch_collate.collate(samples, collate_fn_map=fn_map)


def _place(writer: _SlotWriter, node: Any) -> Any:
    """`node` with its batch tensors copied into the ring."""
    def leaf(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return _NOT_A_LEAF
        return writer.copy(x) if x.dim() > 0 else x
    return _map_leaves(node, leaf)


class RingWriter(NamedTuple):
    """A ring slot leased for one batch, handed to the loader worker that
    collates it (with the batch's indices): where each tensor leaf goes, in the
    memory the producer shares with its workers."""

    pid: int         # the producer's: the ring is /proc/<pid>/fd/<fd>
    fd: int
    ring_bytes: int
    seq: int
    offsets: list[int]  # one per tensor leaf, in the order the batch lists them
    bytes: list[int]    # room at each offset

    def commit(self, samples: list[Any], fn: Callable[[list[Any]], Any] | None,
               plain: Callable[[list[Any]], Any]) -> "InRing | Declined":
        """Collates `samples` into the slot: with `fn` (a collate of the
        user's), its tensors are copied there; without, torch's default collate
        stacks them there. InRing: what was written where; Declined: the batch
        collated as usual by `plain` (the producer copies it; the lease goes
        back)."""
        if fn is not None:
            batch = fn(samples)  # its errors are the loader's
            try:
                return InRing(self.seq, _place(_SlotWriter(self), batch))
            except Exception:
                return Declined(self.seq, batch)
        try:
            return InRing(self.seq, _default_into(_SlotWriter(self), samples))
        except Exception:
            # Whatever kept it out of the ring (a larger batch, a type the
            # ring cannot hold, an error in the samples), the usual collate
            # decides: it collates the batch, or raises the loader's error.
            return Declined(self.seq, plain(samples))


class LeasedIndices(list):  # type: ignore[type-arg]
    """A batch's sample indices, with the writer of the slot leased for the
    batch (None: none); it travels to the worker with them (pickled)."""

    writer: RingWriter | None = None


class Samples(list):  # type: ignore[type-arg]
    """A batch's samples as fetched in the worker, with the writer its
    indices came with, for the loader's collate (`collate`)."""

    writer: RingWriter | None = None


class WritingDataset:
    """A map-style dataset as the producer's loader workers see it: the same
    samples, fetched a batch at a time, handed to the collate together with
    the writer of the batch's lease (DataLoader's workers call
    `__getitems__` with a batch's indices and collate what it returns)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __getitems__(self, indices: list[Any]) -> Any:
        fetch = getattr(self.dataset, "__getitems__", None)
        samples = fetch(list(indices)) if fetch else [self.dataset[i] for i in indices]
        writer = getattr(indices, "writer", None)
        if writer is None or type(samples) is not list:
            # (a __getitems__ of the dataset's own that returns something
            # else: collated as it is, and the lease comes back unused)
            return samples
        out = Samples(samples)
        out.writer = writer
        return out

    def __getitem__(self, index: Any) -> Any:
        return self.dataset[index]

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "dataset" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["dataset"], name)


class collate:
    """A DataLoader collate that writes each batch straight into the producer's
    ring when the producer reserved a slot for it (its loader workers then
    copy nothing more, and the producer copies nothing at all).

    A producer uses it by itself for a DataLoader with workers and the default
    collate. For a collate of your own that returns tensors, wrap it::

        DataLoader(ds, batch_size=64, num_workers=8, collate_fn=bc.collate(my_collate))

    Your collate's tensors are then copied into the ring in the worker (off the
    producer's thread). Outside a producer, or without a reserved slot, it is
    your collate (or torch's default_collate) unchanged.
    """

    def __init__(self, fn: Callable[[list[Any]], Any] | None = None) -> None:
        if fn is not None and not callable(fn):
            raise TypeError(f"batchcast.collate wraps a collate function, not {type(fn).__name__}")
        self.fn = fn

    def plain(self, samples: list[Any]) -> Any:
        if self.fn is not None:
            return self.fn(samples)
        from torch.utils.data import default_collate

        return default_collate(samples)

    def __call__(self, samples: list[Any]) -> Any:
        writer = getattr(samples, "writer", None)
        if writer is None:
            return self.plain(samples)
        return writer.commit(list(samples), self.fn, self.plain)

    def __repr__(self) -> str:
        return f"batchcast.collate({self.fn!r})" if self.fn is not None else "batchcast.collate()"


def materialize(node: Any, ring: torch.Tensor) -> Any:
    """A worker's batch with its RingTensors as views of the producer's ring."""
    return _map_leaves(node, lambda x: view_of(ring, x) if isinstance(x, RingTensor) else _NOT_A_LEAF)


class _LeasingBatches(WrappedBatchSampler):
    """The loader's batch sampler, each batch's indices given a lease."""

    def __init__(self, batch_sampler: Any, leaser: "Leaser") -> None:
        self.batch_sampler = batch_sampler
        self.leaser = leaser

    def __iter__(self) -> Iterator[Any]:
        for indices in self.batch_sampler:
            leased = LeasedIndices(indices)
            leased.writer = self.leaser.take()
            yield leased


class Leaser:
    """Gives a DataLoader's batches leases from a producer's ring while the
    producer serves it; `restore()` gives the loader back as it was."""

    @staticmethod
    def applies(loader: Any) -> bool:
        """Whether the loader's workers can write into the ring: a DataLoader
        with workers over a map-style dataset, batches from a batch sampler,
        the default collate or batchcast.collate, and no iterator started yet.
        (An IterableDataset's workers fetch samples without their indices, so
        a lease cannot reach the collate with them: its batches take the copy.)"""
        from torch.utils.data import DataLoader, IterableDataset, default_collate

        return (isinstance(loader, DataLoader) and loader.num_workers > 0
                and not isinstance(loader.dataset, IterableDataset)
                and loader.batch_sampler is not None
                and (loader.collate_fn is default_collate or isinstance(loader.collate_fn, collate))
                and getattr(loader, "_iterator", None) is None)

    @staticmethod
    def in_flight(loader: Any) -> int:
        """Batches the loader asks of its workers ahead, and one more: the
        next is asked for before the one received is published."""
        return int(loader.num_workers * (loader.prefetch_factor or 2) + 1)

    def __init__(self, loader: Any, core: Any, limit: int) -> None:
        self.loader = loader
        self.core: Any = core
        self.limit = limit
        self.pid = os.getpid()
        # Which leases are out is the producer's slot ledger's to say
        # (core.lease_out, core.return_leases); what follows is the order.
        # Batches asked for without a lease (before the ring existed) and not
        # yet back, and slots leased for them once it does: the producer
        # copies them there, so that every batch lies where the one before
        # it ends (a consumer batch spanning them is one view).
        self.unleased = 0
        self.for_copies: collections.deque[int] = collections.deque()
        self.primed = False
        self.off = False  # leasing failed for good (see take)
        self._ring: torch.Tensor | None = None
        self._collate = loader.collate_fn
        self._batch_sampler = loader.batch_sampler
        self._dataset = loader.dataset
        if not isinstance(loader.collate_fn, collate):
            loader.collate_fn = collate()
        # DataLoader refuses to set batch_sampler and dataset after
        # construction; the wrappers keep their lengths and attributes, so the
        # loader behaves the same.
        object.__setattr__(loader, "batch_sampler", _LeasingBatches(self._batch_sampler, self))
        object.__setattr__(loader, "dataset", WritingDataset(self._dataset))

    @property
    def dataset(self) -> Any:
        """The loader's own dataset (while leasing, the loader holds a wrapper)."""
        return self._dataset

    @property
    def collate_fn(self) -> Callable[[list[Any]], Any]:
        """The loader's own collate function."""
        return self._collate  # type: ignore[no-any-return]

    def _lease(self) -> tuple[int, int, int, list[int], list[int]] | None:
        if self.core is None or self.off:
            return None
        try:
            return self.core.lease(self.limit)  # type: ignore[no-any-return]
        except _C.CudaError as exc:
            # A GPU ring whose host mirror cannot be pinned: batches take the
            # copy through staging instead, as with any other loader.
            self.off = True
            warnings.warn(f"batchcast: loader workers cannot write into pinned memory ({exc}); "
                          "each batch is copied to the GPU through staging instead",
                          RuntimeWarning, stacklevel=2)
            return None

    def take(self) -> RingWriter | None:
        if self.core is None:
            return None
        got = self._lease()
        if got is None:
            self.unleased += 1
            return None
        seq, fd, ring_bytes, offsets, sizes = got
        return RingWriter(self.pid, fd, ring_bytes, seq, offsets, sizes)

    def unpack(self, batch: Any) -> tuple[Any, int | None, bool]:
        """(the batch as the producer publishes it, its lease or None, whether
        a worker wrote it into that lease)."""
        if isinstance(batch, InRing) and self.core.lease_out(batch.seq):
            if self._ring is None:
                self._ring = self.core.host_ring()
            return materialize(batch.batch, self._ring), batch.seq, True
        if isinstance(batch, Declined) and self.core.lease_out(batch.seq):
            self.core.return_lease(batch.seq)
            return batch.batch, None, False
        self.unleased = max(0, self.unleased - 1)
        if self.for_copies:  # copied into the slot leased for it
            seq = self.for_copies.popleft()
            return batch, seq, False
        return batch, None, False

    def published(self) -> None:
        """After a publish: once the ring exists (after the first), the
        batches already asked for without a lease get slots, in order."""
        if self.primed or self.core is None:
            return
        self.primed = True
        for _ in range(self.unleased):
            got = self._lease()
            if got is None:
                break
            self.for_copies.append(got[0])

    def epoch_done(self) -> None:
        """The epoch's iterator is exhausted: no worker writes any more, so
        leases whose batches never came back (an iterable dataset's workers
        that ran out) go back."""
        self.core.return_leases()
        self.for_copies.clear()
        self.unleased = 0

    def restore(self) -> None:
        self.core = None
        self._ring = None
        self.loader.collate_fn = self._collate
        object.__setattr__(self.loader, "batch_sampler", self._batch_sampler)
        object.__setattr__(self.loader, "dataset", self._dataset)

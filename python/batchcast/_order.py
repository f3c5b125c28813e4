"""The producer's order: every consumer's epochs stay whole, whenever it joined.

A consumer that joins mid-epoch, after sample position p of the producer's
epoch e, starts with the next batch: its epochs are its own, positions p..M
of epoch e then 0..p of epoch e + 1, and so on. Each is the whole dataset
exactly when the samples at positions 0..p are the same set in consecutive
epochs. So while it serves, the producer owns its DataLoader's order: each
epoch it draws the loader's own fresh order (its sampler, its generator) and
keeps each *block* — the samples between two consecutive join positions of
the consumers present — the same set as in the epoch before, in the fresh
order filtered to the block. With nobody joined mid-epoch there is one block:
the order is the loader's own, exactly (a seeded run reproduces). A join
position goes when its consumer leaves: its blocks merge.

What that does to randomness: while a join position lasts, a sample stays
within its block from epoch to epoch (a sample among the first p stays among
the first p); within the block its order is fresh every epoch.
"""

from __future__ import annotations

import bisect
import collections
from typing import Any, Iterator

import torch

from ._sampler import WrappedBatchSampler


def steering(loader: Any) -> str | None:
    """None when the producer can keep the loader's blocks (a DataLoader over a
    map-style dataset, batches from torch's BatchSampler over a sampler whose
    every epoch is the same samples in a new order); else why it cannot."""
    from torch.utils.data import (BatchSampler, DataLoader, IterableDataset, RandomSampler,
                                  SequentialSampler, SubsetRandomSampler)

    if not isinstance(loader, DataLoader):
        return f"its loader is a {type(loader).__name__}, not a DataLoader"
    if isinstance(loader.dataset, IterableDataset):
        return "its DataLoader's dataset is an IterableDataset (it orders its samples itself)"
    if type(loader.batch_sampler) is not BatchSampler:
        return (f"its DataLoader's batch sampler is a {type(loader.batch_sampler).__name__}, not "
                "torch's BatchSampler")
    sampler = loader.batch_sampler.sampler
    if type(sampler) is RandomSampler and sampler.replacement:
        return "its DataLoader's RandomSampler draws with replacement (epochs are not permutations)"
    if type(sampler) is RandomSampler and sampler.num_samples % max(len(sampler.data_source), 1):
        return (f"its DataLoader's RandomSampler draws num_samples={sampler.num_samples} of "
                f"{len(sampler.data_source)} (each epoch ends with another random subset)")
    if type(sampler) not in (SequentialSampler, RandomSampler, SubsetRandomSampler):
        return (f"its DataLoader's sampler is a {type(sampler).__name__}: only SequentialSampler, "
                "RandomSampler and SubsetRandomSampler are known to give every epoch the same samples")
    if getattr(loader, "_iterator", None) is not None:
        return "its DataLoader's iterator was started before the producer took it"
    return None


def keep_blocks(last: list[Any], fresh: list[Any], cuts: list[int]) -> list[Any]:
    """`fresh` (a new order of the samples of `last`), rearranged so that
    the samples between consecutive `cuts` (sorted positions) are the same set
    as in `last`, each block in the order `fresh` gives them.

    Raises ValueError when `fresh` is not the samples of `last` in another order."""
    if len(fresh) != len(last):
        raise ValueError(f"this epoch has {len(fresh)} samples, the last had {len(last)}")
    if not cuts:
        return list(fresh)
    try:
        last_t = torch.as_tensor(last, dtype=torch.int64)
        fresh_t = torch.as_tensor(fresh, dtype=torch.int64)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        return _keep_blocks_any(last, fresh, cuts)
    if last_t.dim() != 1 or len(last_t) == 0 or int(last_t.min()) < 0 or \
            len(torch.unique(last_t)) != len(last_t):
        return _keep_blocks_any(last, fresh, cuts)  # repeated samples (or not plain indices)
    if not torch.equal(torch.sort(last_t).values, torch.sort(fresh_t).values):
        raise ValueError("this epoch's samples are not the last epoch's")
    block_of = torch.full((int(last_t.max()) + 1,), -1, dtype=torch.int64)
    block_of[last_t] = torch.bucketize(torch.arange(len(last_t)), torch.as_tensor(cuts), right=True)
    order = torch.sort(block_of[fresh_t], stable=True).indices
    return fresh_t[order].tolist()


def _keep_blocks_any(last: list[Any], fresh: list[Any], cuts: list[int]) -> list[Any]:
    """keep_blocks for any hashable samples, repeated ones included."""
    where: dict[Any, collections.deque[int]] = collections.defaultdict(collections.deque)
    for position, sample in enumerate(last):
        where[sample].append(bisect.bisect_right(cuts, position))
    blocks: list[list[Any]] = [[] for _ in range(len(cuts) + 1)]
    for sample in fresh:
        places = where.get(sample)
        if not places:
            raise ValueError(f"sample {sample!r} of this epoch was not in the last (or more often)")
        blocks[places.popleft()].append(sample)
    return [sample for block in blocks for sample in block]


class BlockOrder(WrappedBatchSampler):
    """The DataLoader's batch sampler as the producer serves it: the loader's
    fresh order each epoch, with the blocks between join positions kept
    (`keep` before each epoch), cut into its batches as BatchSampler would."""

    def __init__(self, batch_sampler: Any, samples_per_epoch: int) -> None:
        self.batch_sampler = batch_sampler
        self.samples_per_epoch = samples_per_epoch  # after drop_last
        self.joined_at: list[int] = []
        self.last: list[Any] | None = None  # the order of the last epoch begun

    def keep(self, joined_at: list[int]) -> None:
        """The join positions of the consumers present, for the epoch that begins."""
        self.joined_at = sorted(int(p) for p in joined_at)

    def __iter__(self) -> Iterator[list[Any]]:
        fresh = list(iter(self.batch_sampler.sampler))
        cuts = [p for p in self.joined_at if 0 < p < len(fresh)]
        if cuts and self.samples_per_epoch < len(fresh):
            cuts.append(self.samples_per_epoch)  # what drop_last leaves out stays out
        if cuts and self.last is not None:
            try:
                order = keep_blocks(self.last, fresh, sorted(set(cuts)))
            except ValueError as exc:
                raise ValueError(
                    f"the loader's sampler changed what an epoch holds ({exc}): the consumers that "
                    "joined mid-epoch cannot get every sample of their epochs exactly once. Keep the "
                    "dataset and the sampler as they are while the producer serves") from None
        else:
            order = fresh
        self.last = order
        size = self.batch_sampler.batch_size
        end = len(order) // size * size if self.batch_sampler.drop_last else len(order)
        for start in range(0, end, size):
            yield order[start:start + size]

"""The producer's order: every consumer's epochs stay whole, whenever it joined.

A consumer that joins mid-epoch starts with the next batch; its epochs are
its own and each is the whole dataset because the producer keeps blocks of
its order the same sets from epoch to epoch. Which order that is, is the
core's join plan (csrc/batchcast/producer/join_plan.h): here the DataLoader's
batch sampler is wrapped so that each epoch draws the loader's own fresh
order (its sampler, its generator), asks the plan for the epoch's order, and
cuts it into batches as torch's BatchSampler would. With nobody joined
mid-epoch the order is the loader's own, exactly (a seeded run reproduces).

What that does to randomness: while a join position p lasts, a sample stays
within its block from epoch to epoch (a sample among the first p stays among
the first p); within the block its order is fresh every epoch.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Iterator

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


class BlockOrder(WrappedBatchSampler):
    """The DataLoader's batch sampler as the producer serves it: the loader's
    fresh order each epoch, ordered by `plan` (the core's order_epoch: a
    list of dataset indices in, the epoch's order out), cut into its batches
    as BatchSampler would."""

    def __init__(self, batch_sampler: Any, plan: Callable[[list[int]], list[int]]) -> None:
        self.batch_sampler = batch_sampler
        self._plan = plan
        # Samples that are not integers (a SubsetRandomSampler over keys)
        # travel to the plan as numbers of their own, the same every epoch.
        self._numbers: dict[Any, int] = {}
        self._samples: list[Any] = []

    def __iter__(self) -> Iterator[list[Any]]:
        fresh = list(iter(self.batch_sampler.sampler))
        try:
            order: list[Any] = self._plan([operator.index(sample) for sample in fresh])
        except TypeError:
            order = [self._samples[n] for n in self._plan([self._number(sample) for sample in fresh])]
        size = self.batch_sampler.batch_size
        end = len(order) // size * size if self.batch_sampler.drop_last else len(order)
        for start in range(0, end, size):
            yield order[start:start + size]

    def _number(self, sample: Any) -> int:
        number = self._numbers.get(sample)
        if number is None:
            number = self._numbers[sample] = len(self._samples)
            self._samples.append(sample)
        return number

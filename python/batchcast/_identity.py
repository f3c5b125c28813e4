"""Which samples a loader batch holds: their indices in the loader's dataset.

The producer publishes each batch with its samples' dataset indices where
its loader lets it know them: a DataLoader over a map-style dataset whose
batch sampler yields lists of integer indices and whose batches come back in
the order it asked for them (``in_order``, the default). The batch sampler
is wrapped to note each list of indices as the loader asks for it; each
batch the loader yields is paired with the oldest list not yet paired.
Consumers then know every sample by its dataset index (a consumer's
``transform`` seeds each sample's randomness from it; ``Consumer.with_indices()``
hands the indices out). Elsewhere a sample is known by its position in the
producer's epoch.
"""

from __future__ import annotations

import collections
import logging
import operator
from typing import Any, Iterator

from ._sampler import WrappedBatchSampler

_log = logging.getLogger("batchcast")


def why_unknown(loader: Any) -> str | None:
    """None when the producer can pair the loader's batches with their
    dataset indices, else why it cannot."""
    from torch.utils.data import DataLoader, IterableDataset

    if not isinstance(loader, DataLoader):
        return f"its loader is a {type(loader).__name__}, not a DataLoader"
    if isinstance(loader.dataset, IterableDataset):
        return "its DataLoader's dataset is an IterableDataset (its samples have no indices)"
    if loader.batch_sampler is None:
        return "its DataLoader has batch_size=None (no batch sampler names the samples of a batch)"
    if not getattr(loader, "in_order", True):
        return "its DataLoader has in_order=False (its batches may arrive in another order than asked)"
    if getattr(loader, "_iterator", None) is not None:
        return "its DataLoader's iterator was started before the producer took it"
    return None


class SampleIndices(WrappedBatchSampler):
    """The DataLoader's batch sampler, noting the indices of each batch it
    yields, in order, for `take` to pair with the batches as they arrive."""

    def __init__(self, batch_sampler: Any, name: str) -> None:
        self.batch_sampler = batch_sampler
        self._name = name
        self._asked: collections.deque[list[int] | None] = collections.deque()
        self._off = False  # a batch did not match its indices: known by position from then on

    def __iter__(self) -> Iterator[Any]:
        self._asked.clear()  # a new epoch's iterator: nothing of the last one is coming
        for indices in self.batch_sampler:
            try:
                self._asked.append([operator.index(i) for i in indices])
            except TypeError:  # keys, not integers (a sampler over a dict's keys)
                self._asked.append(None)
            yield indices

    def take(self, samples: int, epoch: int, batch: int) -> list[int] | None:
        """The dataset indices of the batch the loader yielded now (None:
        not known; its samples are known by their positions in the epoch)."""
        indices = self._asked.popleft() if self._asked else None
        if self._off or indices is None:
            return None
        if len(indices) != samples:
            self._off = True
            self._asked.clear()
            _log.warning(
                "producer '%s': loader batch %d of epoch %d has %d samples, but its batch sampler named "
                "%d indices for it (its collate_fn adds or drops samples), so which sample is which is not "
                "known: from here on consumers know samples by their position in the epoch, not their "
                "dataset index", self._name, batch, epoch, samples, len(indices))
            return None
        return indices

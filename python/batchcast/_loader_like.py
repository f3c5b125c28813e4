"""What a consumer shows where code expects a DataLoader: the ``dataset``,
``sampler`` and ``batch_sampler`` look-alikes (their lengths, ``set_epoch``,
clear errors for what a consumer has not), and ``with_indices()``'s epochs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    from .consumer import Consumer


class EpochSamples:
    """A consumer's epoch as a DataLoader's dataset or sampler looks: its
    length, nothing to index (the samples are the producer's)."""

    def __init__(self, consumer: "Consumer", share: bool = False) -> None:
        self._consumer = consumer
        self._share = share  # a group's rank: its part of the epoch (as a DistributedSampler's)

    def __len__(self) -> int:
        c = self._consumer
        core = c._live()
        n = core.own_samples_per_epoch if self._share else core.samples_per_epoch
        if n < 0:
            raise TypeError(
                f"the samples per epoch of consumer '{c.name}' are unknown until the "
                "producer's first epoch ends; pass samples_per_epoch= to the Producer "
                "(batchcast serve --samples-per-epoch N)")
        return int(n)

    def __getitem__(self, index: Any) -> Any:
        raise TypeError(
            f"consumer '{self._consumer.name}' has no samples to index: they are loaded by its "
            "producer and arrive in batches (iterate the consumer)")

    def __iter__(self) -> Iterator[Any]:
        raise TypeError(
            f"consumer '{self._consumer.name}' has no sampler to iterate: the producer's loader "
            "orders the samples (iterate the consumer for its batches)")

    def set_epoch(self, epoch: int) -> None:
        """Accepted and ignored, as the producer's loader orders each epoch."""

    def __repr__(self) -> str:
        return f"<batchcast epoch of consumer {self._consumer.name!r}>"


class EpochBatches(EpochSamples):
    """A consumer's epoch as a DataLoader's batch_sampler looks."""

    def __len__(self) -> int:
        return len(self._consumer)

    @property
    def batch_size(self) -> int | None:
        return self._consumer.batch_size

    @property
    def drop_last(self) -> bool:
        return self._consumer.drop_last

    @property
    def sampler(self) -> EpochSamples:
        return EpochSamples(self._consumer, share=True)


class WithIndices:
    """A consumer's epochs with each batch's sample identities
    (``Consumer.with_indices()``): each ``iter()`` is one epoch of
    ``(batch, indices)``."""

    def __init__(self, consumer: "Consumer") -> None:
        self._consumer = consumer

    def __iter__(self) -> Iterator[Any]:
        return self._consumer._iterate(indices=True)

    def __len__(self) -> int:
        return len(self._consumer)

    def __repr__(self) -> str:
        return f"<batchcast epochs with indices of consumer {self._consumer.name!r}>"

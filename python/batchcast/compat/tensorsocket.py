"""TensorSocket's API on batchcast: change the import, keep the code.

    # from tensorsocket import TensorProducer, TensorConsumer
    from batchcast.compat.tensorsocket import TensorProducer, TensorConsumer

    producer = TensorProducer(data_loader, 5556)           # producer process
    for _ in range(epochs):
        for _ in producer:
            pass
    producer.join()

    consumer = TensorConsumer(5556, batch_size=128)         # each training process
    for epoch in range(epochs):
        for inputs, targets in consumer:
            ...

The port becomes the batchcast name ``tensorsocket-<port>`` (a Unix socket in
the per-user runtime directory; no TCP port is opened). Iterating the producer
serves one epoch, yielding ``None`` per loader batch as TensorSocket does, and
waits for a first consumer before it starts. A consumer, like TensorSocket's,
is its own iterator: each loop over it is one epoch of batches of its own
``batch_size``, every sample exactly once (a loop left early resumes there).
TensorSocket's tuning arguments (``ack_port``, ``heart_ports``,
``rubber_band_pct``, ``consumer_max_buffer_size``, ``producer_batch_size``)
are accepted and ignored: batchcast has no acknowledgements, heartbeats or
rubber band (a consumer that joins mid-epoch starts with the next batch,
its epochs its own, as with ``batchcast.Consumer``). A custom ``pack_fn`` or
``unpack_fn`` is applied to each batch as it is published or received
(``pack_fn`` makes every batch anew, so the loader's workers cannot write
into shared memory: each batch takes the producer's one copy). Batches arrive as the loader made them (a DataLoader's
list stays a list) rather than as tuples, and GPU placement follows batchcast
(pass ``device="cuda:0"`` to the producer) instead of moving every batch to
the GPU whenever one is present.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

from ..consumer import Consumer
from ..producer import Producer

__all__ = ["TensorConsumer", "TensorProducer", "name_for_port"]


def name_for_port(port: int | str) -> str:
    """The batchcast name a TensorSocket port maps to."""
    try:
        return f"tensorsocket-{int(port)}"
    except (TypeError, ValueError):
        raise ValueError(f"port must be an int (or a string of one), not {port!r}") from None


class TensorProducer:
    """``tensorsocket.TensorProducer(data_loader, port, ...)`` served by a
    ``batchcast.Producer`` named ``tensorsocket-<port>``. Extra keyword
    arguments (``device``, ``slots``, ``min_consumers``, ...) go to the Producer."""

    def __init__(
        self,
        data_loader: Iterable[Any],
        port: int | str = 5555,
        ack_port: int | str = 5556,
        heart_ports: tuple[int, int] = (4444, 4445),
        rubber_band_pct: float = 0.005,
        pack_fn: Callable[[Any], Any] | None = None,
        consumer_max_buffer_size: int = 10,
        producer_batch_size: int = 8,
        **producer_options: Any,
    ) -> None:
        del ack_port, heart_ports, rubber_band_pct, consumer_max_buffer_size, producer_batch_size
        self.port = port
        self.data_loader = data_loader
        # The loader itself goes to the producer (its order, workers and length
        # are what joining mid-epoch and in-place writes need); pack_fn is
        # applied to each batch as it is published.
        self._producer = Producer(data_loader, name_for_port(port), epochs=None,
                                  pack_fn=pack_fn, **producer_options)
        self.epoch = 0

    @property
    def name(self) -> str:
        return self._producer.name

    def __iter__(self) -> Iterator[None]:
        """Serves one epoch (after waiting for a first consumer)."""
        producer = self._producer
        if producer._core is None:
            raise RuntimeError(f"producer '{producer.name}' was joined (closed)")
        if self.epoch == 0:
            producer._core.wait_for_consumers(producer.min_consumers)
        epoch, self.epoch = self.epoch, self.epoch + 1
        return producer._serve_epoch(producer._core, epoch)

    def __len__(self) -> int:
        return len(self.data_loader)  # type: ignore[arg-type]

    def join(self) -> None:
        """Ends serving: consumers see the end of the stream; frees the name."""
        core = self._producer._core
        if core is not None:
            core.finish()
        self._producer.close()

    def stats(self) -> dict[str, Any]:
        return self._producer.stats()

    def __enter__(self) -> "TensorProducer":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.join()


class TensorConsumer:
    """``tensorsocket.TensorConsumer(port, batch_size=...)`` as a
    ``batchcast.Consumer`` of ``tensorsocket-<port>``. Extra keyword arguments
    (``timeout``, ``drop_last``, ``device``, ...) go to the Consumer."""

    def __init__(
        self,
        port: int | str = 5555,
        ack_port: int | str = 5556,
        heart_ports: tuple[int, int] = (4444, 4445),
        unpack_fn: Callable[[Any], Any] | None = None,
        batch_size: int = 64,
        **consumer_options: Any,
    ) -> None:
        del ack_port, heart_ports
        self.port = port
        self.batch_size = batch_size
        self.unpack_fn = unpack_fn
        self._consumer = Consumer(name_for_port(port), batch_size=batch_size, **consumer_options)
        self._epoch: Iterator[Any] | None = None

    def __iter__(self) -> "TensorConsumer":
        # As TensorSocket's: the consumer is its own iterator; a loop left early
        # resumes where it stopped, and StopIteration ends each epoch.
        return self

    def __next__(self) -> Any:
        if self._epoch is None:
            self._epoch = iter(self._consumer)
        try:
            batch = next(self._epoch)
        except StopIteration:
            self._epoch = None
            raise
        return batch if self.unpack_fn is None else self.unpack_fn(batch)

    def __len__(self) -> int:
        return len(self._consumer)

    def stats(self) -> dict[str, Any]:
        return self._consumer.stats()

    def close(self) -> None:
        self._epoch = None
        self._consumer.close()

    def __enter__(self) -> "TensorConsumer":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

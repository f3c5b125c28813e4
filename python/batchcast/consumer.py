"""The consumer side: a drop-in replacement for a DataLoader in a training
script. Yields the producer's batches rebatched to this consumer's size."""

from __future__ import annotations

import warnings
from typing import Any, Iterator

from . import _C
from ._device import parse_device
from ._structure import unflatten


class Consumer:
    """Iterate it like a DataLoader: each ``iter()`` is one epoch.

    Example::

        loader = bc.Consumer("imagenet", batch_size=96)   # was: DataLoader(...)
        for epoch in range(10):
            for images, labels in tqdm(loader):           # len(loader): batches per epoch
                loss = model(images) ...

    ``batch_size`` is this trainer's own; without one, the producer's loader
    batches arrive as they are (``len()`` is the loader's). ``len()`` is the
    number of batches in an epoch; it raises ``TypeError`` (which ``tqdm`` and
    ``operator.length_hint`` take as "unknown") while the producer's loader has no
    length and its first epoch has not ended.

    Tensors are read-only views of shared memory (modify copies, not them); they
    stay valid for as long as you hold them, and the producer reuses their
    memory only after every consumer has dropped them. Keeping many batches is
    fine, as with a DataLoader: once what you keep pins more than this
    consumer's share of the producer's ring, new batches arrive as private
    copies instead (a ``batchcast.KeptBatchesWarning`` says so once), so that
    nobody waits for you.

    ``device`` says where batches arrive. By default, where the producer put
    them: host shared memory, or the producer's GPU (zero-copy views; the
    current CUDA stream waits for the producer's copy, and the memory is reused
    only once that stream is past your last use of it, so use a batch on the
    stream that was current when you took it, or pass ``release_after="device"``
    if you also use batches on side streams: then a slot goes back only once
    the whole GPU is past it). ``device="cuda:K"`` on another
    GPU costs one GPU-to-GPU copy per loader batch; ``device="cpu"`` from a GPU
    producer costs one device-to-host copy. ``stats()`` says which was chosen.
    """

    def __init__(
        self,
        name: str,
        batch_size: int | None = None,
        *,
        drop_last: bool = False,
        timeout: float = 30.0,
        late_join: str = "next_epoch",
        device: Any = None,
        release_after: str = "stream",
        runtime_dir: str | None = None,
    ) -> None:
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)):
            raise ValueError(f"batch_size must be a positive int (or None), not {batch_size!r}")
        if late_join not in ("next_epoch", "catch_up"):
            raise ValueError(f"late_join must be 'next_epoch' or 'catch_up', not {late_join!r}")
        if release_after not in ("stream", "device"):
            raise ValueError(f"release_after must be 'stream' or 'device', not {release_after!r}")
        self.name = name
        self.batch_size = batch_size
        self.drop_last = bool(drop_last)
        placement, cuda_device = _C.Placement.AUTO, -1
        if device is not None:
            kind, cuda_device = parse_device(device, "device")
            placement = _C.Placement.HOST if kind == "cpu" else _C.Placement.CUDA
        self._core = _C.Consumer(
            name=name,
            batch_size=batch_size,
            drop_last=self.drop_last,
            timeout=float(timeout),
            runtime_dir=runtime_dir or "",
            catch_up=late_join == "catch_up",
            placement=placement,
            cuda_device=cuda_device,
            release_after=_C.ReleaseAfter.STREAM if release_after == "stream" else _C.ReleaseAfter.DEVICE,
        )
        self._stats: dict | None = None

    def __iter__(self) -> Iterator[Any]:
        core = self._live()
        core.begin_epoch()
        return self._epoch(core)

    def _epoch(self, core: Any) -> Iterator[Any]:
        empty = True
        while True:
            item = core.next()
            if item is None:
                break
            empty = False
            layout, leaves, _ = item
            yield unflatten(layout, leaves)
        if empty and core.finished:
            warnings.warn(
                f"batchcast producer '{self.name}' has finished serving; this epoch is empty",
                RuntimeWarning,
                stacklevel=2,
            )

    def __len__(self) -> int:
        n = self._live().batches_per_epoch
        if n < 0:
            raise TypeError(
                f"the length of consumer '{self.name}' is unknown until the producer's first "
                "epoch ends (its loader has no length); pass samples_per_epoch= to the Producer"
            )
        return n

    def __bool__(self) -> bool:
        # Always true, as an object: `if loader:` must not ask for a length
        # that may still be unknown (see __len__).
        return True

    def _live(self) -> Any:
        if self._core is None:
            raise RuntimeError(f"consumer of '{self.name}' is closed")
        return self._core

    def close(self) -> None:
        """Leaves the producer. Tensors already handed out stay valid."""
        core, self._core = self._core, None
        if core is not None:
            self._stats = core.stats()
            core.close()

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def stats(self) -> dict:
        """Counters: batches and samples received, views vs copies, slots held,
        dropped malformed messages; the device batches arrive on, how they get
        there (``transfer``) and the CUDA IPC handles opened (once, at join)."""
        return self._core.stats() if self._core is not None else dict(self._stats or {})

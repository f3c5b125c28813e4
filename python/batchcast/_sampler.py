"""A DataLoader's batch sampler as the producer serves it: wrappers that change
what it yields (the block order, the ring leases) and answer for everything
else (its length, batch_size, drop_last, sampler, ...) as the wrapped one."""

from __future__ import annotations

from typing import Any


class WrappedBatchSampler:
    """Subclasses set ``self.batch_sampler`` (the wrapped one) and yield
    batches of indices from ``__iter__``."""

    batch_sampler: Any

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __getattr__(self, name: str) -> Any:  # batch_size, drop_last, sampler, ...
        if name.startswith("__") or "batch_sampler" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["batch_sampler"], name)

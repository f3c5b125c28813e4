"""batchcast: one data-loading pipeline, many training processes.

    bc.Producer(loader, name="demo", epochs=2).run()   # producer process
    loader = bc.Consumer("demo", batch_size=48)          # each training process
"""

import torch  # noqa: F401  (first: _C links against torch's libraries)

from ._C import (
    PROTOCOL_VERSION,
    CudaError,
    Error,
    Evicted,
    LoaderError,
    NameInUse,
    ProducerLost,
    RebatchError,
    Refused,
)
from .consumer import Consumer
from .producer import Producer

__version__ = "0.1.0"


def cuda_available() -> bool:
    """Whether this batchcast can serve and receive batches in GPU memory here:
    built with its CUDA transport, and at least one GPU visible."""
    from ._C import cuda_built, cuda_device_count

    return bool(cuda_built()) and cuda_device_count() > 0


__all__ = [
    "Consumer",
    "CudaError",
    "Error",
    "Evicted",
    "LoaderError",
    "NameInUse",
    "PROTOCOL_VERSION",
    "Producer",
    "ProducerLost",
    "RebatchError",
    "Refused",
    "cuda_available",
]

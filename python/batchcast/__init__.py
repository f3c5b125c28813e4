"""batchcast: one data-loading pipeline, many training processes.

    bc.Producer(loader, name="demo", epochs=2).run()   # producer process
    loader = bc.Consumer("demo", batch_size=48)          # each training process
"""

import torch  # noqa: F401  (first: _C links against torch's libraries)

from . import _C, _report
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
from ._report import BatchcastWarning, KeptBatchesWarning, LingerWarning
from .consumer import Consumer
from .producer import Producer

__version__ = "0.1.0"

_C.set_report_handler(_report.handle)


def cuda_available() -> bool:
    """Whether this batchcast can serve and receive batches in GPU memory here:
    built with its CUDA transport, and at least one GPU visible."""
    return bool(_C.cuda_built()) and _C.cuda_device_count() > 0


__all__ = [
    "BatchcastWarning",
    "Consumer",
    "CudaError",
    "Error",
    "Evicted",
    "KeptBatchesWarning",
    "LingerWarning",
    "LoaderError",
    "NameInUse",
    "PROTOCOL_VERSION",
    "Producer",
    "ProducerLost",
    "RebatchError",
    "Refused",
    "cuda_available",
]

"""batchcast: one data-loading pipeline, many training processes.

    bc.Producer(loader, name="demo", epochs=2).run()   # producer process
    loader = bc.Consumer("demo", batch_size=48)          # each training process
"""

from ._C import (
    PROTOCOL_VERSION,
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

__all__ = [
    "Consumer",
    "Error",
    "Evicted",
    "LoaderError",
    "NameInUse",
    "PROTOCOL_VERSION",
    "Producer",
    "ProducerLost",
    "RebatchError",
    "Refused",
]

"""batchcast: one data-loading pipeline, many training processes.

    bc.Producer(loader, name="demo", epochs=2).run()   # producer process
    loader = bc.Consumer("demo", batch_size=48)          # each training process
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Cheap (no torch): warnings, and what `batchcast status` and `--help` need.
from ._report import BatchcastWarning, KeptBatchesWarning, LingerWarning, ResumeWarning
from .options import Augment, Cache, Group, Join, Pad, Placement

if TYPE_CHECKING:
    from . import ray, transformers
    from ._C import (
        PROTOCOL_VERSION,
        CudaError,
        EpochsExhausted,
        Error,
        Evicted,
        GroupError,
        LoaderError,
        NameInUse,
        ProducerLost,
        RebatchError,
        Refused,
        Stalled,
    )
    from ._in_ring import collate
    from ._transform import TransformError
    from .consumer import Consumer
    from .producer import Producer

    __version__: str

# Everything else loads on first use (PEP 562), torch and the core with it, so
# that the command line answers at once: `bc.Producer`, `from batchcast import
# Consumer` and the exceptions work as plain attributes.
_FROM_CORE = ("PROTOCOL_VERSION", "CudaError", "EpochsExhausted", "Error", "Evicted", "GroupError", "LoaderError",
              "NameInUse", "ProducerLost", "RebatchError", "Refused", "Stalled")
_FROM_MODULE = {"Consumer": ".consumer", "Producer": ".producer", "collate": "._in_ring",
                "TransformError": "._transform"}


def _version() -> str:
    """This copy's version: its distribution's metadata, else the file the
    build writes beside the package (a source tree with the module built in)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("batchcast")
    except PackageNotFoundError:
        pass
    try:
        from ._version import version as built
    except ImportError:
        return "0+unknown"
    return str(built)


def __getattr__(name: str) -> Any:
    if name == "_C":  # the compiled core, loaded the one way (torch first, reports handled)
        value = importlib.import_module("._core", __name__)._C
    elif name in _FROM_CORE:
        from ._core import _C

        value = getattr(_C, name)
    elif name in _FROM_MODULE:
        value = getattr(importlib.import_module(_FROM_MODULE[name], __name__), name)
    elif name in ("ray", "transformers"):  # imports Ray, transformers: only when asked for
        value = importlib.import_module("." + name, __name__)
    elif name == "__version__":
        value = _version()
    else:
        raise AttributeError(f"module 'batchcast' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | {"__version__", "ray", "transformers"})


def cuda_available() -> bool:
    """Whether this batchcast can serve and receive batches in GPU memory here:
    built with its CUDA transport, and at least one GPU visible."""
    from ._core import _C

    return bool(_C.cuda_built()) and _C.cuda_device_count() > 0


__all__ = [
    "Augment",
    "BatchcastWarning",
    "Cache",
    "Consumer",
    "CudaError",
    "EpochsExhausted",
    "Error",
    "Evicted",
    "Group",
    "GroupError",
    "Join",
    "KeptBatchesWarning",
    "LingerWarning",
    "LoaderError",
    "NameInUse",
    "PROTOCOL_VERSION",
    "Pad",
    "Placement",
    "Producer",
    "ProducerLost",
    "RebatchError",
    "Refused",
    "ResumeWarning",
    "Stalled",
    "TransformError",
    "collate",
    "cuda_available",
]

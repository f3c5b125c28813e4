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
    GroupError,
    LoaderError,
    NameInUse,
    ProducerLost,
    RebatchError,
    Refused,
)
from ._report import BatchcastWarning, KeptBatchesWarning, LingerWarning, ResumeWarning
from .consumer import Consumer
from .producer import Producer


def _version() -> str:
    """The version of this copy of batchcast: from pyproject.toml when it runs
    from a source tree (python/batchcast beside it), else from the installed
    distribution's metadata."""
    import re
    from pathlib import Path

    pyproject = Path(__file__).resolve().parent.parent.parent / "pyproject.toml"
    try:
        text = pyproject.read_text()
    except OSError:
        text = ""
    project = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    if project and re.search(r'^name\s*=\s*"batchcast"', project.group(1), re.M):
        found = re.search(r'^version\s*=\s*"([^"]+)"', project.group(1), re.M)
        if found:
            return found.group(1)
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return "0+unknown"
    try:
        return version("batchcast")
    except PackageNotFoundError:
        return "0+unknown"


__version__: str = _version()

_C.set_report_handler(_report.handle)


def __getattr__(name: str):
    # batchcast.ray imports Ray: only when asked for (bc.ray.consumer(...)).
    if name == "ray":
        import importlib

        return importlib.import_module(".ray", __name__)
    raise AttributeError(f"module 'batchcast' has no attribute {name!r}")


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
    "GroupError",
    "KeptBatchesWarning",
    "LingerWarning",
    "LoaderError",
    "NameInUse",
    "PROTOCOL_VERSION",
    "Producer",
    "ProducerLost",
    "RebatchError",
    "Refused",
    "ResumeWarning",
    "cuda_available",
]

"""The C++ core, loaded once: torch first (batchcast._C links against its
libraries), then the handler that turns the core's reports into warnings and
log records. Every module that uses the core imports it from here."""

import importlib
from typing import TYPE_CHECKING

import torch  # noqa: F401

from . import _report

if TYPE_CHECKING:
    from . import _C
else:
    # Not `from . import _C`: that asks the package for the attribute first,
    # and the package's lazy __getattr__ would come back here.
    _C = importlib.import_module(f"{__package__}._C")

_C.set_report_handler(_report.handle)

__all__ = ["_C"]

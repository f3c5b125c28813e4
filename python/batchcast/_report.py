"""Where the core's reports go: things a user should fix become Python
warnings (filterable, ``-W error`` turns them into exceptions), events go to
``logging.getLogger("batchcast")``. The core calls `handle` on the thread of
the call that was running, never from a background thread."""

from __future__ import annotations

import logging
import os
import sys
import warnings

logger = logging.getLogger("batchcast")


class BatchcastWarning(UserWarning):
    """Base of every warning batchcast gives."""


class KeptBatchesWarning(BatchcastWarning):
    """A consumer keeps so many of its batches that they pin more than its
    share of the producer's ring; it now takes private copies of new batches.
    Keep ``.clone()``s of what you store, not the batches themselves."""


class LingerWarning(BatchcastWarning):
    """A producer freed its GPU ring while consumers still mapped it (after
    ``linger`` seconds): batches they still hold are no longer valid."""


class ResumeWarning(BatchcastWarning):
    """A consumer resumed at a position the producer no longer held: the
    samples it had not taken of that epoch are lost to it, and the same
    positions of the producer's next pass stand in for them."""


_CATEGORIES = {"KeptBatches": KeptBatchesWarning, "Linger": LingerWarning,
               "Resume": ResumeWarning}

# Levels as the core numbers them (batchcast._C.ReportLevel).
_DEBUG, _INFO, _NOTICE, _WARNING = 0, 1, 2, 3


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _users_level() -> int:
    """warnings.warn's stacklevel, from handle(), of the first frame that is
    not batchcast's own: the user's line that called into batchcast."""
    level, frame = 1, sys._getframe(1)  # (handle's frame)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        level, frame = level + 1, frame.f_back
    return level


def handle(level: int, kind: str, message: str) -> None:
    if level == _WARNING:
        warnings.warn(message, _CATEGORIES.get(kind, BatchcastWarning), stacklevel=_users_level())
    elif level == _NOTICE:
        logger.warning(message)
    elif level == _INFO:
        logger.info(message)
    else:
        logger.debug(message)

"""Forks of a process in which batchcast runs torch code on its own threads.

A fork copies the memory of every thread but continues only the one that
forked: a lock another thread held at that moment stays held in the child
for ever. A consumer's transform runs the trainer's torch code on batchcast's
threads (torch holds its generators' and allocator's locks while an op runs,
and Python locks of its own while seeding), while a DataLoader forks its
workers from another thread (the producer's, in a notebook; the trainer's
own validation loader): a worker born while a transform held such a lock
waits for it for ever, before its loop, and its loader with it.

So every call of batchcast's into a trainer's transform is a `section`, and a
fork of the process (``os.register_at_fork``) waits until no section is under
way, and holds new ones back until it is done. A section lasts one sample: a
fork waits for microseconds to milliseconds. A fork from inside a section (a
transform that forks) does not wait for itself. A section that does not end
within ``FORK_WAIT`` seconds (a transform stuck on something) lets the fork go
on with a WARNING, rather than hang the forking thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from types import TracebackType

_log = logging.getLogger("batchcast")

FORK_WAIT = 10.0  # seconds a fork waits for sections under way

_cond = threading.Condition(threading.Lock())
_active = 0  # sections under way, in every thread
_forking: int | None = None  # the thread that is forking (new sections wait)
_depth = threading.local()  # this thread's sections under way
_forks_held = 0  # forks that waited for a section (for tests)


class _Section:
    """``with section:`` around one call into a trainer's transform."""

    __slots__ = ()

    def __enter__(self) -> None:
        global _active
        me = threading.get_ident()
        with _cond:
            while _forking is not None and _forking != me:
                _cond.wait()
            _active += 1
        _depth.n = getattr(_depth, "n", 0) + 1

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        global _active
        _depth.n -= 1
        with _cond:
            _active -= 1
            if _active == 0:
                _cond.notify_all()


section = _Section()


def active() -> int:
    """Sections under way now (for tests)."""
    return _active


def forks_held() -> int:
    """Forks of this process that waited for a section (for tests)."""
    return _forks_held


def _before_fork() -> None:
    global _forking, _forks_held
    own = getattr(_depth, "n", 0)
    deadline = time.monotonic() + FORK_WAIT
    with _cond:
        _forking = threading.get_ident()
        if _active > own:
            _forks_held += 1
        while _active > own:
            left = deadline - time.monotonic()
            if left <= 0:
                _log.warning(
                    "a fork of process %d waited %.0f s for a batchcast consumer's transform to "
                    "finish its sample, and goes on without it: if the child hangs, a lock the "
                    "transform held was copied held (make the transform return, or start the "
                    "DataLoader's workers with multiprocessing_context='spawn')", os.getpid(), FORK_WAIT)
                break
            _cond.wait(left)


def _after_fork_in_parent() -> None:
    global _forking
    with _cond:
        _forking = None
        _cond.notify_all()


def _after_fork_in_child() -> None:
    # Only the forking thread goes on here: its own sections are the only ones.
    global _cond, _active, _forking
    _cond = threading.Condition(threading.Lock())
    _active = getattr(_depth, "n", 0)
    _forking = None


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)

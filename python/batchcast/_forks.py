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

A trainer's own code is the same hazard: trials as threads of a process
(Optuna's ``n_jobs``), or a notebook that trains beside the producer it
started, run torch ops (building a model draws its weights, a dropout draws,
from the generator under its lock) while the producer's DataLoader forks its
workers from another thread. So an open consumer is a section too (a
``Turn``) while the thread that iterates it runs its own code: from the
consumer's making until its first ``next()``, and from each batch (or epoch
end) handed out until the next ``next()``, until it is closed. A fork waits
until every such thread is back inside its consumer, waiting for a batch
(where it holds no torch lock). The producer that forks makes no batch
meanwhile, so the trainers' rings drain and they come back within a few
steps; a consumer left open without iterating holds forks for FORK_WAIT.
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
_trainers = 0  # ... of which trainers' turns
_own: dict[int, int] = {}  # each thread's sections under way
_forking: int | None = None  # the thread that is forking (new sections wait)
_forks_held = 0  # forks that waited for a section (for tests)


def _enter(trainer: bool) -> int:
    global _active, _trainers
    me = threading.get_ident()
    with _cond:
        while _forking is not None and _forking != me:
            _cond.wait()
        _active += 1
        _trainers += trainer
        _own[me] = _own.get(me, 0) + 1
    return me


def _leave(thread: int, trainer: bool) -> None:
    global _active, _trainers
    with _cond:
        if _own.get(thread, 0) == 0:
            return  # entered in the process this one was forked from, on another thread
        _active -= 1
        _trainers = max(0, _trainers - trainer)
        left = _own.get(thread, 0) - 1
        if left > 0:
            _own[thread] = left
        else:
            _own.pop(thread, None)
        if _active == 0 or _forking is not None:
            _cond.notify_all()


class _Section:
    """``with section:`` around one call into a trainer's transform."""

    __slots__ = ()

    def __enter__(self) -> None:
        _local.entered = [*getattr(_local, "entered", ()), _enter(False)]

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        _leave(_local.entered.pop(), False)


_local = threading.local()  # the threads' sections entered (as a stack)
section = _Section()


class Turn:
    """A trainer's turn: a consumer is open and the thread that iterates it
    runs its own code (``begin()``), not waiting inside the consumer for a
    batch (``end()``). ``begin()`` on another thread moves the turn there;
    ``end()`` twice is once."""

    __slots__ = ("_thread",)

    def __init__(self) -> None:
        self._thread: int | None = None

    def begin(self) -> None:
        if self._thread == threading.get_ident():
            return
        self.end()
        self._thread = _enter(True)

    def end(self) -> None:
        if self._thread is not None:
            thread, self._thread = self._thread, None
            _leave(thread, True)


def active() -> int:
    """Sections under way now (for tests)."""
    return _active


def forks_held() -> int:
    """Forks of this process that waited for a section (for tests)."""
    return _forks_held


def _before_fork() -> None:
    global _forking, _forks_held
    me = threading.get_ident()
    deadline = time.monotonic() + FORK_WAIT
    with _cond:
        own = _own.get(me, 0)
        _forking = me
        if _active > own:
            _forks_held += 1
        while _active > own:
            left = deadline - time.monotonic()
            if left <= 0:
                if _trainers > 0:
                    what = ("a trainer thread of it to come back for its next batch of a batchcast "
                            "consumer (it runs torch code beside the fork, or keeps a consumer open "
                            "without iterating it)")
                else:
                    what = "a batchcast consumer's transform to finish its sample"
                _log.warning(
                    "a fork of process %d waited %.0f s for %s, and goes on without it: if the child "
                    "hangs, a lock that thread held was copied held (serve the loader from a process of "
                    "its own, `batchcast serve`, or start the DataLoader's workers with "
                    "multiprocessing_context='forkserver')", os.getpid(), FORK_WAIT, what)
                break
            _cond.wait(left)


def _after_fork_in_parent() -> None:
    global _forking
    with _cond:
        _forking = None
        _cond.notify_all()


def _after_fork_in_child() -> None:
    # Only the forking thread goes on here: its own sections are the only ones.
    global _cond, _active, _trainers, _own, _forking
    me = threading.get_ident()
    own = _own.get(me, 0)
    _cond = threading.Condition(threading.Lock())
    _active = own
    _trainers = 0  # (only the warning's words read it)
    _own = {me: own} if own else {}
    _forking = None


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)

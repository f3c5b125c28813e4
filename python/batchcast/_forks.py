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
way in another thread, and holds new ones back until it is done. A section
lasts one sample: a fork waits for microseconds to milliseconds. A fork from
inside a section (a transform that forks) does not wait for itself. A section
that does not end within ``FORK_WAIT`` seconds (a transform stuck on
something) lets the fork go on with a WARNING, rather than hang the forking
thread.

A trainer's own code is the same hazard: trials as threads of a process
(Optuna's ``n_jobs``), or a notebook that trains beside the producer it
started, run torch ops (building a model draws its weights, a dropout draws,
from the generator under its lock) while the producer's DataLoader forks its
workers from another thread. So a *thread* that has a consumer open runs its
own code (a section) unless it waits inside one of its consumers (``next()``,
an epoch's start), where it holds no torch lock; from before a consumer
connects it counts as running (a producer that forks its workers as the
trainer joins waits for the trainer's first ``next()``). Each consumer
has a ``Turn``: it belongs to the thread that made it, and moves to the
thread that iterates it; the thread waits while inside it. A thread with
two consumers open (train and validation, a zip of two) waits while inside
either; a consumer opened and left idle in a thread keeps that thread in its
own code until the thread waits in one of its consumers or closes it. A
fork waits until every other thread is waiting (or forking itself: several
threads may fork at once, each guarded), and new sections of other threads
wait until the forks are done. The producer that forks makes no batch
meanwhile, so the trainers' rings drain and they come back within a few
steps; a thread that keeps a consumer open and never iterates one holds
forks for FORK_WAIT, and the WARNING names it and where its consumer was
made.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from types import FrameType, TracebackType

_log = logging.getLogger("batchcast")

FORK_WAIT = 10.0  # seconds a fork waits for sections under way


class _Thread:
    """What one thread has under way: transform sections, consumers open
    (their turns), and how deep it waits inside consumers."""

    __slots__ = ("sections", "turns", "waiting", "thread", "name")

    def __init__(self) -> None:
        self.sections = 0
        self.turns: dict[Turn, None] = {}  # open, in the order made
        self.waiting = 0
        self.thread = threading.current_thread()
        self.name = self.thread.name

    def running(self) -> bool:
        """In a section, or in its own code with a consumer open (a thread
        that ended with a consumer still open runs nothing)."""
        own_code = bool(self.turns) and self.waiting == 0
        return self.sections > 0 or (own_code and self.thread.is_alive())


_cond = threading.Condition(threading.RLock())  # (re-entered by a __del__ that a collection runs)
_threads: dict[int, _Thread] = {}
_forking: dict[int, int] = {}  # threads forking now (their new sections wait for no one)
_forks_held = 0  # forks that waited for a section (for tests)


def _mine(me: int) -> _Thread:
    t = _threads.get(me)
    if t is None:
        t = _threads[me] = _Thread()
    return t


def _drop_if_idle(me: int, t: _Thread) -> None:
    if t.sections == 0 and not t.turns and t.waiting == 0:
        _threads.pop(me, None)


def _hold_back(me: int) -> None:
    """(under _cond) Waits while another thread forks: this one is about to
    run code that may take torch's locks."""
    # (No allocation under the lock: a garbage collection there could run a
    # consumer's __del__, whose close() takes the lock again.)
    while _forking and (len(_forking) > 1 or me not in _forking):
        _cond.wait()


def _changed() -> None:
    """(under _cond) A thread stopped running: a fork may be waiting for it."""
    if _forking:
        _cond.notify_all()


class _Section:
    """``with section:`` around one call into a trainer's transform."""

    __slots__ = ()

    def __enter__(self) -> None:
        if not _installed:
            _install()
        me = threading.get_ident()
        with _cond:
            _hold_back(me)
            _mine(me).sections += 1

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        me = threading.get_ident()
        with _cond:
            t = _threads.get(me)
            if t is None or t.sections == 0:
                return  # entered in the process this one was forked from, on another thread
            t.sections -= 1
            _drop_if_idle(me, t)
            _changed()


section = _Section()


class Turn:
    """A consumer's place in the fork guard: open from its making until
    ``close()``, in the thread that made it or last iterated it; ``wait()``
    when that thread goes inside the consumer to wait (for a batch, an epoch,
    the producer), ``resume()`` when it comes back to its own code. It is
    made waiting (the consumer connects first)."""

    __slots__ = ("_thread", "_waiting", "made")

    def __init__(self, what: str) -> None:
        me = threading.get_ident()
        if not _installed:
            _install()
        # Where the user made it (for the WARNING that names an idle one).
        self.made = f"{what}, made in thread {threading.current_thread().name!r} at {_caller()}"
        with _cond:
            t = _mine(me)
            t.turns[self] = None
            t.waiting += 1
            self._waiting = True
            self._thread: int | None = me

    def _move(self, me: int) -> None:
        """(under _cond) Makes this thread the one that has it open."""
        if self._thread != me:
            if self._thread is not None:
                old = _threads.get(self._thread)
                if old is not None:
                    old.turns.pop(self, None)
                    _drop_if_idle(self._thread, old)
            _mine(me).turns[self] = None
            self._thread = me

    def wait(self) -> None:
        """This thread goes inside the consumer: it runs no torch code now."""
        me = threading.get_ident()
        with _cond:
            if self._thread is None or self._waiting:
                return
            self._move(me)
            _threads[me].waiting += 1
            self._waiting = True
            _changed()

    def resume(self) -> None:
        """This thread comes back to its own code with the consumer open."""
        me = threading.get_ident()
        with _cond:
            if self._thread is None:
                return  # closed meanwhile
            _hold_back(me)
            if self._waiting:
                t = _threads.get(self._thread)
                if t is not None and t.waiting > 0:
                    t.waiting -= 1
                self._waiting = False
            self._move(me)

    def close(self) -> None:
        """The consumer is closed (twice is once)."""
        with _cond:
            if self._thread is None:
                return
            t = _threads.get(self._thread)
            if t is not None:
                t.turns.pop(self, None)
                if self._waiting and t.waiting > 0:
                    t.waiting -= 1
                _drop_if_idle(self._thread, t)
            self._thread = None
            self._waiting = False
            _changed()


def _caller() -> str:
    """The first frame outside batchcast: where the user's code made it."""
    f: FrameType | None = sys._getframe(2)
    here = os.path.dirname(os.path.abspath(__file__))
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == here:
        f = f.f_back
    return "an unknown place" if f is None else f"{f.f_code.co_filename}:{f.f_lineno}"


def active() -> int:
    """Threads running a section or their own code with a consumer open (for tests)."""
    with _cond:
        return sum(t.running() for t in _threads.values())


def forking() -> bool:
    """Whether a thread of this process is forking now (for tests)."""
    return bool(_forking)


def forks_held() -> int:
    """Forks of this process that waited for a section (for tests)."""
    return _forks_held


def _others_running(me: int) -> list[_Thread]:
    return [t for ident, t in _threads.items()
            if ident != me and ident not in _forking and t.running()]


def _before_fork() -> None:
    global _forks_held
    me = threading.get_ident()
    deadline = time.monotonic() + FORK_WAIT
    with _cond:
        _forking[me] = _forking.get(me, 0) + 1
        if _others_running(me):
            _forks_held += 1
        while running := _others_running(me):
            left = deadline - time.monotonic()
            if left <= 0:
                _log.warning(
                    "a fork of process %d waited %.0f s for %s, and goes on without it: if the child "
                    "hangs, a lock such a thread held was copied held (serve the loader from a process "
                    "of its own, `batchcast serve`, or start the DataLoader's workers with "
                    "multiprocessing_context='forkserver')", os.getpid(), FORK_WAIT, _describe(running))
                break
            _cond.wait(left)


def _describe(running: list[_Thread]) -> str:
    parts = []
    for t in running:
        if t.sections:
            parts.append(f"thread {t.name!r} to finish a batchcast consumer's transform of a sample")
        else:
            parts.append(f"thread {t.name!r}, which runs its own code (torch ops, perhaps) with "
                         f"{len(t.turns)} batchcast consumer(s) open, to wait inside one of them for "
                         f"its next batch or close it ({'; '.join(turn.made for turn in t.turns)})")
    return "; ".join(parts)


def _after_fork_in_parent() -> None:
    me = threading.get_ident()
    with _cond:
        left = _forking.get(me, 0) - 1
        if left > 0:
            _forking[me] = left
        else:
            _forking.pop(me, None)
        _cond.notify_all()


def _after_fork_in_child() -> None:
    # Only the forking thread goes on here: what it has under way is all there is.
    global _cond, _threads, _forking
    me = threading.get_ident()
    _cond = threading.Condition(threading.RLock())
    mine = _threads.get(me)
    _threads = {me: mine} if mine is not None else {}
    _forking = {}


_installed = False


def _install() -> None:
    """Hooks the guard into this process's forks, once, when the first
    consumer opens (a process that imports batchcast and never opens one
    forks unguarded, as it would without it)."""
    global _installed
    # (No lock: a fork could copy it held. Two threads opening their first
    # consumers at once could both register; the hooks then run twice, each
    # pair balanced, which only waits twice.)
    if not _installed:
        _installed = True
        os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                            after_in_child=_after_fork_in_child)

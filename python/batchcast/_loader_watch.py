"""A producer's loader that delivers nothing for a long time is not silent.

While the producer waits for its loader's next batch (a DataLoader's worker
deadlocked on a lock a fork copied held, a stuck network file system, a
dataset that waits for something), every trainer waits with it. A watch
thread looks at the wait once a second; past ``warn_after`` seconds it logs a
WARNING naming how long, and which of the loader's worker processes are alive
(to point ``py-spy dump`` at), again after twice as long, and so on. The core
keeps the pids for ``stats()`` and ``batchcast status``.

The loader's workers are born from the producer: each is tied to the
producer's process (``tie_to_producer``), so that one stuck where its own
watchdog does not look (before its loop, or inside a ``__getitem__`` that
never returns) still ends once the producer's process is gone.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable

from ._core import _C

_log = logging.getLogger("batchcast")

WARN_AFTER = 60.0  # seconds; BATCHCAST_LOADER_WARN_SECONDS overrides


def warn_after() -> float:
    value = os.environ.get("BATCHCAST_LOADER_WARN_SECONDS", "")
    try:
        seconds = float(value) if value else WARN_AFTER
    except ValueError:
        raise ValueError(f"BATCHCAST_LOADER_WARN_SECONDS must be a number of seconds, not {value!r}") from None
    if not seconds > 0:
        raise ValueError(f"BATCHCAST_LOADER_WARN_SECONDS must be > 0, not {value!r}")
    return seconds


def alive(pid: int) -> bool:
    """Whether process `pid` runs (not a zombie), without reaping it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] not in (b"Z", b"X")


def worker_pids(iterator: Any) -> list[int]:
    """A DataLoader iterator's worker processes (none for another iterator)."""
    workers = getattr(iterator, "_workers", None) or []
    return [int(w.pid) for w in workers if getattr(w, "pid", None)]


# ---- workers tied to their producer ----------------------------------------
_starting = threading.local()  # set in a producer's thread while it starts its loader's workers


class starting_workers:
    """``with starting_workers():`` around ``iter(loader)`` in the producer:
    the processes forked meanwhile by this thread are the loader's workers."""

    def __enter__(self) -> None:
        _starting.pid = os.getpid()

    def __exit__(self, *exc: Any) -> None:
        _starting.pid = None


def _tie_to_producer() -> None:
    producer = getattr(_starting, "pid", None)
    if producer is not None:
        _starting.pid = None
        _C.exit_with_process(producer, 1)


os.register_at_fork(after_in_child=_tie_to_producer)


# ---- the watch ---------------------------------------------------------------
class LoaderWatch:
    """Watches a serving producer's waits for its loader (a thread of its own,
    ended by ``close()``)."""

    def __init__(self, core: Any, name: str, workers: Callable[[], list[int]]) -> None:
        self.core = core
        self.name = name
        self.workers = workers
        self.warn_after = warn_after()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"batchcast-loader-watch-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_warning = self.warn_after
        last_wait = 0.0
        noted: list[int] | None = None
        while not self._stop.wait(min(1.0, self.warn_after / 4)):
            try:
                stats = self.core.stats(reports=False)  # (events are said on the user's threads)
                pids = [p for p in self.workers() if alive(p)]
                if pids != noted:
                    self.core.note_loader_workers(pids)
                    noted = pids
            except Exception:  # closed meanwhile
                return
            waiting = float(stats.get("waiting_seconds", 0)) if stats.get("waiting_for") == "loader" else 0.0
            if waiting < last_wait or waiting == 0.0:  # a new wait (or none): warn afresh
                next_warning = self.warn_after
            last_wait = waiting
            if waiting >= next_warning:
                self._warn(waiting, pids, stats)
                next_warning = 2 * waiting

    def _warn(self, waited: float, pids: list[int], stats: dict[str, Any]) -> None:
        if pids:
            workers = (f"its worker processes alive: {', '.join(map(str, pids))} "
                       f"(`py-spy dump --pid {pids[0]}` shows where one is)")
        else:
            workers = "no worker process of it is alive (it loads in the producer's own thread)"
        _log.warning(
            "producer '%s' has waited %.0f s for its loader's next batch (epoch %s, after %s batches "
            "of it); every trainer waits with it. %s. A worker may be stuck on a file system or "
            "on a lock (a DataLoader forking its workers while another thread of the process ran "
            "torch code); next warning after %.0f s", self.name, waited,
            stats.get("epoch"), stats.get("epoch_batches"), workers, 2 * waited)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

"""What `batchcast serve` shows while it serves: an epoch progress bar and a
status line on a terminal (rich), a plain line per refresh anywhere else,
log records and warnings in between — all read from the producer's
statistics."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, TextIO


def duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, s = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{s:02d}s"
    hours, m = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{m:02d}m"
    days, h = divmod(hours, 24)
    return f"{days}d{h:02d}h"


def rate(value: float) -> str:
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def share(part: float, whole: float) -> str:
    return f"{100 * min(max(part / whole, 0.0), 1.0):.0f}%" if whole > 0 else "-"


class Live:
    """What the live status says: rates and time shares over the last
    interval, from two successive ``producer.stats()``."""

    def __init__(self, min_consumers: int) -> None:
        self.min_consumers = min_consumers
        self.previous: tuple[float, dict[str, Any]] | None = None
        self.last_progress: float | None = None

    def line(self, stats: dict[str, Any], now: float) -> str:
        previous, self.previous = self.previous, (now, stats)
        published = stats.get("batches_published", 0)
        if self.last_progress is None or previous is None or \
                published != previous[1].get("batches_published", 0):
            self.last_progress = now
        consumers = [c for c in stats.get("consumers", []) if not c.get("leaving")]
        parts, shares = [], ""
        if previous is not None and now > previous[0]:
            dt = now - previous[0]
            old = previous[1]

            def delta(key: str) -> float:
                return float(stats.get(key, 0)) - float(old.get(key, 0))

            if consumers or delta("batches_published"):
                parts.append(f"{rate(delta('batches_published') / dt)} batches/s, "
                             f"{rate(delta('samples_published') / dt)} samples/s")
            waiting_for = stats.get("waiting_for")
            if consumers and waiting_for in ("loader", "consumers") and \
                    not delta("batches_published"):
                # The counters move when a wait ends; say what it is now.
                waiting = "the loader"
                if waiting_for == "consumers":
                    waiting = "the consumers (ring full)"
                    behind = [c for c in consumers if c.get("holding_up")]
                    if behind:
                        waiting = f"consumer pid {behind[0].get('pid')} (ring full)"
                idle = duration(now - self.last_progress)
                shares = f"no batch for {idle}: waiting for {waiting}"
                if stats.get("stuck"):
                    shares = f"stuck: {stats['stuck']}"
            elif consumers or published:
                loader, wait, copy = (delta(k) for k in
                                      ("loader_seconds", "wait_seconds", "publish_seconds"))
                # Waits are counted when they end: one interval may hold more than itself.
                whole = max(dt, loader + wait + copy)
                shares = (f"waiting for loader {share(loader, whole)}, "
                          f"for consumers {share(wait, whole)}, copying {share(copy, whole)}")
        if not consumers:
            want = max(self.min_consumers, 1) if published == 0 else 1
            parts.append(f"waiting for {want} consumer{'s' if want > 1 else ''} to join")
        else:
            n = len(consumers)
            text = f"{n} consumer{'s' if n > 1 else ''}"
            if n < self.min_consumers and published == 0:
                text += f" (waiting for {self.min_consumers})"
            slowest = max(consumers, key=lambda c: (c.get("lag", 0), c.get("stall_seconds", 0)))
            text += f", slowest lag {slowest.get('lag', 0)} (pid {slowest.get('pid')})"
            parts.append(text)
        if shares:
            parts.append(shares)
        return " | ".join(parts)


def epoch_label(stats: dict[str, Any], epochs: int | None) -> str:
    """Epochs are numbered from 0, as consumers, errors and `status` number them."""
    epoch = int(stats.get("epoch", -1))
    if epoch < 0:
        return "epoch -"
    return f"epoch {epoch}" + (f" of 0-{epochs - 1}" if epochs is not None else "")


def fit(parts: list[str], width: int) -> str:
    """The parts of a status line, joined, as many as fit `width` (whole parts:
    no word is cut)."""
    line = ""
    for part in parts:
        candidate = f"{line} | {part}" if line else part
        if len(candidate) > width and line:
            break
        line = candidate
    return line


def epoch_progress(stats: dict[str, Any]) -> tuple[int, int | None]:
    """Batches published in the epoch in progress, and of how many (None
    while the loader cannot say and no epoch has ended): the producer's own
    statistics, whatever its loader is."""
    total = int(stats.get("batches_per_epoch", -1))
    return int(stats.get("epoch_batches", 0)), (total if total > 0 else None)


def progress_text(stats: dict[str, Any], epochs: int | None) -> str:
    """The epoch's progress as a line says it: 'epoch 2 of 0-9: 45/100 batches'."""
    if int(stats.get("epoch", -1)) < 0:
        return "epoch -: nothing loaded yet"
    done, total = epoch_progress(stats)
    text = f"{min(done, total)}/{total}" if total else f"{done}"
    return f"{epoch_label(stats, epochs)}: {text} batches"


class Screen:
    """The status on stderr, drawn by rich. On a terminal: an epoch progress
    bar and a status line redrawn in place (rich.live), log records and
    warnings printed above them. Anywhere else (a log file, a pipe, a
    notebook's cell running the command): one plain line per refresh, the same
    text whatever reads it. A stderr that fails (a closed terminal) silences
    it; serving goes on."""

    def __init__(self, stream: TextIO, tty: bool, epochs: int | None) -> None:
        from rich.console import Console

        self.epochs = epochs
        self.broken = False
        self._lock = threading.Lock()
        # Never a notebook's rich display: a cell that runs the command shows
        # the lines a log file gets. No markup or highlighting: text is text.
        self.console = Console(file=stream, force_jupyter=False, markup=False, highlight=False,
                               emoji=False, soft_wrap=True)
        self.live = tty and self.console.is_terminal and not self.console.is_dumb_terminal
        if self.live:
            from rich.live import Live
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            # Rendered inside the Live below, never started on its own.
            self._progress = Progress(TextColumn("{task.description}", markup=False),
                                      BarColumn(), MofNCompleteColumn(), TextColumn("batches"),
                                      TimeElapsedColumn(), console=self.console,
                                      auto_refresh=False)
            self._task = self._progress.add_task("epoch -", total=None)
            self._epoch = -1
            self._live = Live(self._view(""), console=self.console, auto_refresh=False,
                              transient=True, redirect_stdout=True, redirect_stderr=True)
            # Live hides the cursor until it stops: a serve killed meanwhile
            # (a second Ctrl-C, SIGKILL) would leave the terminal without one.
            self._guarded(self._start_live)

    def _start_live(self) -> None:
        self._live.start()
        self.console.show_cursor(True)

    def _view(self, status: str) -> Any:
        from rich.console import Group
        from rich.text import Text

        # Whole parts of the status, as many as the terminal's width takes.
        return Group(self._progress, Text(fit(status.split(" | "), self.console.width)))

    def _guarded(self, draw: Callable[[], None]) -> None:
        with self._lock:
            if self.broken:
                return
            try:
                draw()
            except (OSError, ValueError):
                self.broken = True

    def message(self, text: str) -> None:
        self._guarded(lambda: self.message_line(text))

    def update(self, stats: dict[str, Any], status: str) -> None:
        def draw() -> None:
            if not self.live:
                stamp = time.strftime("%H:%M:%S")
                self.message_line(f"{stamp} {progress_text(stats, self.epochs)} | {status}")
                return
            progress, task = self._progress, self._task
            epoch = int(stats.get("epoch", -1))
            if epoch != self._epoch:
                self._epoch = epoch
                progress.reset(task, description=epoch_label(stats, self.epochs))
            # The length may become known within an epoch (after the first one).
            done, total = epoch_progress(stats)
            progress.update(task, total=total, completed=done)
            self._live.update(self._view(status), refresh=True)

        self._guarded(draw)

    def message_line(self, text: str) -> None:
        from rich.text import Text

        self.console.print(Text(text))

    def close(self) -> None:
        def draw() -> None:
            if self.live:
                self.live = False
                self._live.stop()

        self._guarded(draw)


class ScreenLog(logging.Handler):
    def __init__(self, screen: Screen) -> None:
        super().__init__(logging.INFO)
        self.screen = screen

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.screen.message(f"{time.strftime('%H:%M:%S')} {self.format(record)}")
        except Exception:
            self.handleError(record)

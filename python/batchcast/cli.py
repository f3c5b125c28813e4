"""The ``batchcast`` command (also ``python -m batchcast``).

    batchcast serve loaders.py:imagenet --epochs 10 -- /data/imagenet 64
    batchcast status [NAME] [--json]
    batchcast demo [--samples 3072] [--epochs 2]

Errors are one line on stderr (``batchcast: error: ...``) and a non-zero exit
status: 2 for bad arguments (a missing file or function included), 1 when
something fails while running (the function or the loader raised, the name is
taken, a demo check failed), 130 when interrupted before serving began.
"""

from __future__ import annotations

import collections.abc
import importlib.util
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TextIO

import click

if TYPE_CHECKING:
    from .producer import Producer

_SHOW_TRACEBACK = False


class CliError(click.ClickException):
    """A failure reported as one line: ``batchcast: error: <message>``."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        # One per error; click 8.5 declares exit_code a class variable, which
        # type checkers then refuse to assign through an instance.
        vars(self)["exit_code"] = exit_code


def _error_line(message: str) -> None:
    message = " ".join(str(message).split()) or "unknown error"
    click.echo(f"batchcast: error: {message}", err=True)


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _show_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from . import __version__

    click.echo(f"batchcast {__version__}")
    ctx.exit()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_show_version, help="Print batchcast's version and exit.")
@click.option("--traceback", "show_traceback", is_flag=True,
              help="On an error, also print the Python traceback.")
def cli(show_traceback: bool) -> None:
    """Share one PyTorch data-loading pipeline between many training processes.

    Serve a loader with `batchcast serve`, see what running producers and
    their consumers are doing with `batchcast status`, try it with
    `batchcast demo`.
    """
    global _SHOW_TRACEBACK
    _SHOW_TRACEBACK = show_traceback


def main(argv: list[str] | None = None) -> int:
    """Runs the command line; returns the exit status."""
    try:
        result = cli.main(args=argv, standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        exc.show()
        return exc.exit_code
    except click.UsageError as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        _error_line(exc.format_message() + hint)
        return exc.exit_code
    except click.ClickException as exc:
        if _SHOW_TRACEBACK and exc.__cause__ is not None:
            traceback.print_exception(type(exc.__cause__), exc.__cause__,
                                      exc.__cause__.__traceback__)
        _error_line(exc.format_message())
        return exc.exit_code
    except click.Abort:  # Ctrl-C before serving began
        click.echo("batchcast: interrupted", err=True)
        return 130
    except BrokenPipeError:  # `batchcast status | head`
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (no message at exit)
        return 1
    return result if isinstance(result, int) else 0


# ---- serve ----------------------------------------------------------------------------


def _load_function(spec: str) -> tuple[Callable[..., Any], str]:
    """'path/to/file.py:function' -> (the function, its name)."""
    path_text, sep, function = spec.rpartition(":")
    if not sep or not path_text or not function:
        raise CliError(f"'{spec}' is not PATH.py:FUNCTION (a Python file, a colon, the name of "
                       "a function in it that returns the loader)", 2)
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise CliError(f"no such file: {path_text}", 2)
    path = path.resolve()
    module_name = path.stem
    if not module_name.isidentifier() or module_name in sys.modules:  # never shadow a module
        module_name = "_batchcast_serve_" + "".join(c if c.isalnum() else "_" for c in path.stem)
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise CliError(f"cannot import {path_text}: not a Python source file", 2)
    module = importlib.util.module_from_spec(module_spec)
    # As `python PATH.py` would: the file's folder first on sys.path (its
    # neighbours import), and the module registered under its own name, so
    # that DataLoader workers started with spawn can unpickle what it defines.
    sys.path.insert(0, str(path.parent))
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except SystemExit as exc:
        raise CliError(f"importing {path_text} called sys.exit({exc.code!r})") from exc
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise CliError(f"importing {path_text} raised {_describe(exc)}") from exc
    target = getattr(module, function, None)
    if target is None:
        defined = sorted(n for n, v in vars(module).items()
                         if callable(v) and not n.startswith("_")
                         and getattr(v, "__module__", None) == module_name)
        listing = f" (it defines: {', '.join(defined)})" if defined else ""
        raise CliError(f"{path_text} has no function '{function}'{listing}", 2)
    if not callable(target):
        raise CliError(f"'{function}' in {path_text} is {_a(target)}, not a function", 2)
    return target, function


def _a(value: Any) -> str:
    kind = type(value).__name__
    return f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}"


def _make_loader(function: Callable[..., Any], label: str, args: tuple[str, ...],
                 epochs: int | None) -> Any:
    try:
        loader = function(*args)
    except SystemExit as exc:
        raise CliError(f"{label}({', '.join(map(repr, args))}) called sys.exit({exc.code!r})") \
            from exc
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise CliError(f"{label}({', '.join(map(repr, args))}) raised {_describe(exc)}") from exc
    if loader is None:
        raise CliError(f"{label} returned None (a missing return?); it must return a DataLoader "
                       "or another iterable of batches")
    if not hasattr(loader, "__iter__"):
        raise CliError(f"{label} returned {_a(loader)}, which is not iterable; it "
                       "must return a DataLoader or another iterable of batches")
    if isinstance(loader, collections.abc.Iterator) and epochs != 1:
        raise CliError(f"{label} returned {_a(loader)}, an iterator that can be "
                       "iterated only once; return a DataLoader, a list or another re-iterable "
                       "object, or serve a single epoch (--epochs 1)")
    return loader


def _duration(seconds: float) -> str:
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


def _rate(value: float) -> str:
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def _share(part: float, whole: float) -> str:
    return f"{100 * min(max(part / whole, 0.0), 1.0):.0f}%" if whole > 0 else "-"


class _Live:
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
                parts.append(f"{_rate(delta('batches_published') / dt)} batches/s, "
                             f"{_rate(delta('samples_published') / dt)} samples/s")
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
                idle = _duration(now - self.last_progress)
                shares = f"no batch for {idle}: waiting for {waiting}"
                if stats.get("stuck"):
                    shares = f"stuck: {stats['stuck']}"
            elif consumers or published:
                loader, wait, copy = (delta(k) for k in
                                      ("loader_seconds", "wait_seconds", "publish_seconds"))
                # Waits are counted when they end: one interval may hold more than itself.
                whole = max(dt, loader + wait + copy)
                shares = (f"waiting for loader {_share(loader, whole)}, "
                          f"for consumers {_share(wait, whole)}, copying {_share(copy, whole)}")
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


def _epoch_label(stats: dict[str, Any], epochs: int | None) -> str:
    """Epochs are numbered from 0, as consumers, errors and `status` number them."""
    epoch = int(stats.get("epoch", -1))
    if epoch < 0:
        return "epoch -"
    return f"epoch {epoch}" + (f" of 0-{epochs - 1}" if epochs is not None else "")


def _fit(parts: list[str], width: int) -> str:
    """The parts of a status line, joined, as many as fit `width` (whole parts:
    no word is cut)."""
    line = ""
    for part in parts:
        candidate = f"{line} | {part}" if line else part
        if len(candidate) > width and line:
            break
        line = candidate
    return line


def _epoch_progress(stats: dict[str, Any]) -> tuple[int, int | None]:
    """Batches published in the epoch in progress, and of how many (None
    while the loader cannot say and no epoch has ended): the producer's own
    statistics, whatever its loader is."""
    total = int(stats.get("batches_per_epoch", -1))
    return int(stats.get("epoch_batches", 0)), (total if total > 0 else None)


def _progress_text(stats: dict[str, Any], epochs: int | None) -> str:
    """The epoch's progress as a line says it: 'epoch 2 of 0-9: 45/100 batches'."""
    if int(stats.get("epoch", -1)) < 0:
        return "epoch -: nothing loaded yet"
    done, total = _epoch_progress(stats)
    text = f"{min(done, total)}/{total}" if total else f"{done}"
    return f"{_epoch_label(stats, epochs)}: {text} batches"


class _Screen:
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
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn)

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
        return Group(self._progress, Text(_fit(status.split(" | "), self.console.width)))

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
                self.message_line(f"{stamp} {_progress_text(stats, self.epochs)} | {status}")
                return
            progress, task = self._progress, self._task
            epoch = int(stats.get("epoch", -1))
            if epoch != self._epoch:
                self._epoch = epoch
                progress.reset(task, description=_epoch_label(stats, self.epochs))
            # The length may become known within an epoch (after the first one).
            done, total = _epoch_progress(stats)
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


class _ScreenLog(logging.Handler):
    def __init__(self, screen: _Screen) -> None:
        super().__init__(logging.INFO)
        self.screen = screen

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.screen.message(f"{time.strftime('%H:%M:%S')} {self.format(record)}")
        except Exception:
            self.handleError(record)


@cli.command(short_help="Serve a loader to every trainer that asks for it by name.")
@click.argument("spec", metavar="PATH.py:FUNCTION")
@click.argument("args", nargs=-1, metavar="[-- ARGS...]")
@click.option("--name", "-n", default=None,
              help="Name consumers connect to: bc.Consumer(NAME, ...). Default: FUNCTION.")
@click.option("--device", "-d", default="cpu", show_default=True,
              help="Where batches are put once: 'cpu' (host shared memory) or 'cuda:N'.")
@click.option("--epochs", "-e", type=click.IntRange(min=1), default=None,
              help="Epochs to serve, then exit. Default: until stopped (Ctrl-C, SIGTERM).")
@click.option("--slots", type=click.IntRange(min=2), default=8, show_default=True,
              help="Loader batches the ring holds in flight.")
@click.option("--ring-bytes", type=click.IntRange(min=0), default=0, metavar="BYTES",
              help="Least size of the ring. It is sized from the first batch for --slots batches "
                   "up to 4x its size; pass more for larger later batches (the error that "
                   "needs it says how much).")
@click.option("--samples-per-epoch", type=click.IntRange(min=0), default=None, metavar="N",
              help="Samples the loader yields per epoch, where it cannot say itself (no "
                   "len()): trainers then know len() from the start.")
@click.option("--min-consumers", "-m", type=click.IntRange(min=1), default=1, show_default=True,
              help="Consumers to wait for before loading anything (a whole sweep).")
@click.option("--straggler-timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="SECONDS",
              help="Evict a consumer that holds the producer up longer than this. "
                   "Default: wait for the slowest.")
@click.option("--refresh", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Status refresh interval; 0: no live status. "
                   "Default: 1 on a terminal, 5 otherwise.")
def serve(spec: str, args: tuple[str, ...], name: str | None, device: str, epochs: int | None,
          slots: int, ring_bytes: int, samples_per_epoch: int | None, min_consumers: int,
          straggler_timeout: float | None,
          refresh: float | None) -> int:
    """Serve the loader that FUNCTION in PATH.py returns to every trainer that
    asks for it by name.

    FUNCTION is called once, as FUNCTION(*ARGS) with the strings after `--`,
    and returns a DataLoader (or any other re-iterable of batches); it is
    iterated once per epoch, exactly as a training loop would. Trainers use
    `batchcast.Consumer(NAME, batch_size=...)` in place of their DataLoader.

    \b
    Example:
      batchcast serve loaders.py:imagenet --epochs 10 -- /data/imagenet 64

    A live status goes to stderr (batches/s, samples/s, consumers, the
    slowest consumer's lag, the share of time waiting for the loader and for
    the consumers) with an epoch progress bar. Ctrl-C or SIGTERM stops
    cleanly: consumers in mid-epoch get batchcast.ProducerLost, the name is
    free again, and the exit status is 0 (a second Ctrl-C exits at once).
    A loader that raises gives consumers batchcast.LoaderError and exits 1.
    """
    from . import Producer
    from ._core import _C
    from ._device import parse_device

    try:
        parse_device(device, "--device")
    except (TypeError, ValueError) as exc:
        message = str(exc) if "batchcast serves" in str(exc) else \
            f"--device {device!r} is not a device: use 'cpu', 'cuda' or 'cuda:N'"
        raise CliError(message, 2) from exc
    function, function_name = _load_function(spec)
    name = name or function_name
    label = f"{spec.rpartition(':')[0]}:{function_name}"
    loader = _make_loader(function, label, args, epochs)

    # Signals: handled on this (the main) thread, which only watches and
    # draws; the producer serves from its own thread (Producer.start()).
    # The producer is handed the loader itself, never a wrapper: what it
    # learns from a DataLoader (its order, its workers, its length) is what
    # joining mid-epoch, in-place writes and resuming need.
    requested: list[int] = []
    stop_requested = threading.Event()
    serving: list[Producer] = []
    serving_pid = os.getpid()

    def on_signal(signum: int, _frame: Any) -> None:
        if os.getpid() != serving_pid:  # a forked DataLoader worker: its parent stops it
            return
        if requested:  # a second signal while stopping: leave at once
            os.write(2, b"\nbatchcast: stopping at once; the name's files are left for "
                        b"`batchcast status` to remove\n")
            os._exit(128 + signum)
        requested.append(signum)
        stop_requested.set()
        for producer in serving:  # the loader's next batch is its last
            producer.request_stop()

    handled = [signal.SIGINT, signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # not under nohup
        handled.append(signal.SIGHUP)
    previous = {s: signal.signal(s, on_signal) for s in handled}
    try:
        try:
            producer = Producer(loader, name, device=device, epochs=epochs,
                                min_consumers=min_consumers, slots=slots, ring_bytes=ring_bytes,
                                straggler_timeout=straggler_timeout,
                                samples_per_epoch=samples_per_epoch)
        except _C.NameInUse as exc:
            raise CliError(f"{exc} (stop that producer, or pass --name)") from exc
        except (ValueError, TypeError) as exc:  # an invalid name, say
            raise CliError(str(exc), 2) from exc
        except _C.Error as exc:  # CudaError, say
            raise CliError(_describe(exc)) from exc
        serving.append(producer)
        if stop_requested.is_set():  # a signal came while it was being made
            producer.request_stop()
        return _serve(producer, name, epochs, min_consumers, slots, label, refresh,
                      stop_requested, requested)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _serve(producer: Producer, name: str, epochs: int | None,
           min_consumers: int, slots: int, label: str, refresh: float | None,
           stop_requested: threading.Event, requested: list[int]) -> int:
    stream = sys.stderr
    tty = stream.isatty()
    if refresh is None:
        refresh = 1.0 if tty else 5.0
    screen = _Screen(stream, tty and refresh > 0, epochs)
    logger = logging.getLogger("batchcast")
    log_handler = _ScreenLog(screen)
    saved_logging = (logger.level, logger.propagate)
    logger.addHandler(log_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    saved_showwarning = warnings.showwarning

    def show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                     file: TextIO | None = None, line: str | None = None) -> None:
        screen.message(f"{time.strftime('%H:%M:%S')} warning: {category.__name__}: {message}")

    warnings.showwarning = show_warning
    batches_per_epoch = _epoch_progress(producer.stats())[1]
    length = f"{batches_per_epoch} batches per epoch" if batches_per_epoch else \
        "epoch length unknown"
    screen.message(
        f"batchcast: serving '{name}' from {label} on {producer.device} ({length}, {slots} slots, "
        f"{f'{epochs} epochs' if epochs else 'until stopped'}; pid {os.getpid()})")
    screen.message(f"batchcast: trainers: batchcast.Consumer({name!r}, batch_size=...); "
                   "Ctrl-C stops")
    started = time.monotonic()
    live = _Live(min_consumers)
    error: BaseException | None = None
    finished = False
    try:
        producer.start()
        thread = producer._thread
        live.line(producer.stats(), time.monotonic())
        next_refresh = time.monotonic() + (refresh or 0)
        while thread is not None and thread.is_alive() and not stop_requested.is_set():
            stop_requested.wait(0.1 if not refresh else min(0.1, refresh))
            now = time.monotonic()
            if refresh and now >= next_refresh and not stop_requested.is_set():
                next_refresh = now + refresh
                stats = producer.stats()
                screen.update(stats, live.line(stats, now))
        finished = not stop_requested.is_set()
        if stop_requested.is_set():
            signame = signal.Signals(requested[0]).name if requested else "a signal"
            screen.message(f"batchcast: {signame}: stopping (consumers in mid-epoch get "
                           "ProducerLost)")
        try:
            producer.stop(timeout=30.0)
        except BaseException as exc:  # what the loader raised, re-raised by stop()
            error = exc
        if thread is not None and thread.is_alive():
            screen.message("batchcast: the loader did not return within 30 s of the stop; "
                           "leaving anyway")
    finally:
        screen.close()
        warnings.showwarning = saved_showwarning
        logger.removeHandler(log_handler)
        logger.setLevel(saved_logging[0])
        logger.propagate = saved_logging[1]
        producer.close()
    stats = producer.stats()
    summary = (f"{producer.epochs_served} epoch{'s' if producer.epochs_served != 1 else ''}, "
               f"{stats.get('batches_published', 0)} batches, "
               f"{stats.get('samples_published', 0)} samples in "
               f"{_duration(time.monotonic() - started)}")
    if error is not None and not stop_requested.is_set():
        if _SHOW_TRACEBACK:
            traceback.print_exception(type(error), error, error.__traceback__)
        raise CliError(f"the loader raised {_describe(error)} after {summary} (consumers got "
                       "batchcast.LoaderError)")
    how = "served" if finished else "stopped after"
    try:
        click.echo(f"batchcast: {how} {summary}; '{name}' is free", err=True)
        if error is not None:
            click.echo(f"batchcast: while stopping, the loader raised {_describe(error)}",
                       err=True)
    except OSError:  # stderr is gone (a closed terminal): the stop was still clean
        pass
    return 0


# ---- status -----------------------------------------------------------------------------


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _consumer_now(c: dict[str, Any], status: dict[str, Any]) -> str:
    """What a consumer's trainer is most likely doing, as the producer sees it:
    computing (it has batches it has not taken: the producer waits for it if
    the ring is full), or waiting for batches (it took everything it was
    sent): for the loader, or for the ring, which a slower consumer fills."""
    if c.get("waiting_for_group"):
        return "waiting for its group"
    if c.get("leaving"):
        return "leaving"
    if c.get("holding_up"):
        return "computing; the producer waits for it"
    if int(c.get("lag", 0)) > 0:
        return "computing"
    if status.get("waiting_for") == "consumers":
        return "waiting: ring full (a slower consumer)"
    if status.get("waiting_for") == "joins":
        return "waiting: other consumers to join"
    return "waiting: the loader"


def _status_block(listing: dict[str, Any]) -> tuple[list[str], Any]:
    """A producer's status: its lines, then its consumers' table (a rich
    renderable; None without consumers)."""
    name = listing["name"]
    status = listing.get("status")
    if status is None:
        if listing.get("alive"):
            return [f"{name}: running, but did not answer: "
                    f"{listing.get('note') or 'no reply'}"], None
        return [f"{name}: {listing.get('note') or 'not running'}"], None
    uptime = float(status.get("uptime_seconds", 0))
    epoch, done = status.get("epoch", -1), status.get("epochs_done", 0)
    if epoch < 0:
        epoch_text = "no epoch begun yet"
    elif done > epoch:
        epoch_text = f"between epochs ({done} done)"
    else:
        epoch_text = f"epoch {epoch} ({done} done)"
    lines = [
        f"{name}: pid {status.get('pid')}, {status.get('ring_device', '?')}, "
        f"up {_duration(uptime)}, {epoch_text}, ring {_bytes(status.get('ring_bytes', 0))} "
        f"({status.get('slots', '?')} slots, {status.get('slots_in_use', 0)} batches in it)",
    ]
    batches, samples = status.get("batches_published", 0), status.get("samples_published", 0)

    def per_s(v: float) -> str:
        return _rate(v / uptime) if uptime > 0 else "-"

    lines.append(f"  published {batches} batches, {samples} samples: {per_s(batches)} batches/s, "
                 f"{per_s(samples)} samples/s (over uptime)")
    loader, wait, copy = (float(status.get(k, 0)) for k in
                          ("loader_seconds", "wait_seconds", "publish_seconds"))
    other = max(0.0, uptime - loader - wait - copy)
    lines.append(f"  time: waiting for loader {_share(loader, uptime)}, for consumers "
                 f"{_share(wait, uptime)}, copying {_share(copy, uptime)}, "
                 f"other {_share(other, uptime)} (waiting for joins, between epochs)")
    events = [f"{status.get(k, 0)} {k}" for k in ("joins", "leaves", "crashes", "evictions")
              if status.get(k, 0)]
    consumers = status.get("consumers", [])
    lines.append(f"  consumers: {len(consumers)}" + (f" ({', '.join(events)})" if events else ""))
    waiting, since = status.get("waiting_for"), float(status.get("waiting_seconds", 0))
    if waiting == "joins":
        lines.append(f"  waiting for {status.get('consumers_wanted')} consumers to join before "
                     f"loading (min_consumers; {len(consumers)} present)")
    elif waiting == "consumers":
        behind = [c for c in consumers if c.get("holding_up")]
        who = f"consumer pid {behind[0].get('pid')}" if behind else "the consumers"
        lines.append(f"  now: waiting {_duration(since)} for {who} to free ring space")
    elif waiting == "loader":
        lines.append(f"  now: waiting {_duration(since)} for the loader's next batch")
    if status.get("stuck"):  # nothing can move: the consumers keeping batches are about to go
        lines.append(f"  stuck: {status['stuck']}")
    if not consumers:
        return lines, None
    from rich.padding import Padding
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold")
    for header in ("pid", "batch", "first epoch", "batches sent", "lag", "slots held/kept",
                   "stalled", "now"):
        table.add_column(header, justify="right", no_wrap=True)
    for c in consumers:
        table.add_row(
            str(c.get("pid")) + (" (leaving)" if c.get("leaving") else ""),
            str(c.get("batch_size") or "loader's"),
            str(c.get("first_epoch")),
            str(c.get("batches_sent")),
            str(c.get("lag")),
            f"{c.get('slots_held', 0)}/{c.get('slots_pinned', 0)}",
            _share(float(c.get("stall_seconds", 0)), uptime),
            _consumer_now(c, status),
        )
    return lines, Padding(table, (0, 0, 0, 4), expand=False)


@cli.command(short_help="Show running producers and their consumers.")
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=1.0,
              show_default=True, metavar="SECONDS",
              help="How long each producer has to answer.")
def status(name: str | None, as_json: bool, timeout: float) -> int:
    """Show the producers of this user on this machine and their consumers.

    Each running producer is asked through its socket (nothing is read from
    files that could be stale). For each: pid, device, uptime, epoch (counted
    from 0), throughput averaged over its uptime, and where its time went:
    waiting for the loader, waiting for consumers (ring full), copying
    batches in. For each consumer: pid, batch size, first epoch, batches sent,
    lag (batches sent but not yet consumed), ring slots it holds and how many
    of those it keeps, and the share of the producer's time spent waiting
    for it. What a producer that is gone left behind is reported and removed.

    Exit status: 0; 1 when NAME is given and no producer of that name runs.
    """
    from .status import list_producers

    try:
        listings = list_producers(name, timeout=timeout)
    except ValueError as exc:  # an invalid name
        raise CliError(str(exc), 2) from exc
    except Exception as exc:
        raise CliError(_describe(exc)) from exc
    if as_json:
        click.echo(json.dumps(listings, indent=2))
    elif not listings:
        click.echo("no batchcast producers are running")
    else:
        from rich.console import Console
        from rich.text import Text

        # On a terminal its width; elsewhere (a pipe, a log) wide enough that
        # no table wraps. Plain text unless stdout is a terminal.
        console = Console(force_jupyter=False, markup=False, highlight=False, emoji=False,
                          soft_wrap=True, width=None if sys.stdout.isatty() else 200)
        for k, listing in enumerate(listings):
            lines, table = _status_block(listing)
            if k:
                console.print()
            console.print(Text("\n".join(lines)))
            if table is not None:
                console.print(table, soft_wrap=False)
    if name is not None and not any(p.get("alive") for p in listings):
        return 1
    return 0


# ---- demo -------------------------------------------------------------------------------


def _batch_sizes(_ctx: click.Context, _param: click.Parameter, value: str) -> list[int]:
    try:
        sizes = [int(v) for v in value.replace(",", " ").split()]
    except ValueError:
        sizes = []
    if not sizes or any(s < 1 for s in sizes):
        raise click.BadParameter(f"'{value}' is not a list of positive ints like 32,64,100")
    return sizes


@cli.command(short_help="Run one producer and three trainers on synthetic images.")
@click.option("--samples", type=click.IntRange(min=1), default=3072, show_default=True,
              help="Synthetic 64x64 images per epoch.")
@click.option("--epochs", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--batch-sizes", default="32,64,100", show_default=True, callback=_batch_sizes,
              help="One trainer per batch size.")
@click.option("--compare/--no-compare", default=True, show_default=True,
              help="Then run the same trainers with a DataLoader each.")
def demo(samples: int, epochs: int, batch_sizes: list[int], compare: bool) -> int:
    """One producer runs a CPU image pipeline once; trainers with different
    batch sizes train from it, check that they saw every sample exactly once
    per epoch and report their throughput, then (unless --no-compare) the
    same trainers run with a DataLoader each for comparison."""
    from . import demo as demo_module

    try:
        demo_module.run(samples=samples, epochs=epochs, batch_sizes=batch_sizes, compare=compare)
    except demo_module.DemoFailed as exc:
        raise CliError(str(exc)) from exc
    return 0

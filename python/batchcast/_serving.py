"""`batchcast serve`: the user's loader served until its epochs are done or
a signal comes (SIGINT, SIGTERM, SIGHUP: a clean stop; a second one: at
once), with the live display on stderr."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from typing import TYPE_CHECKING, Any, TextIO

import click

from ._cli_error import CliError, describe
from ._display import Live, Screen, ScreenLog, duration, epoch_progress
from ._loader_spec import load_function, make_loader

if TYPE_CHECKING:
    from .options import Cache
    from .producer import Producer


def serve(spec: str, args: tuple[str, ...], name: str | None, device: str, epochs: int | None,
          slots: int, ring_bytes: int, samples_per_epoch: int | None, min_consumers: int,
          straggler_timeout: float | None, refresh: float | None, show_traceback: bool,
          cache: Cache | None = None) -> int:
    """Serves; returns the exit status (CliError for what fails)."""
    from ._core import _C
    from ._device import parse_device
    from .producer import Producer

    try:
        parse_device(device, "--device")
    except (TypeError, ValueError) as exc:
        message = str(exc) if "batchcast serves" in str(exc) else \
            f"--device {device!r} is not a device: use 'cpu', 'cuda' or 'cuda:N'"
        raise CliError(message, 2) from exc
    function, function_name = load_function(spec)
    name = name or function_name
    label = f"{spec.rpartition(':')[0]}:{function_name}"
    loader = make_loader(function, label, args, epochs)

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
                                samples_per_epoch=samples_per_epoch, cache=cache)
        except _C.NameInUse as exc:
            raise CliError(f"{exc} (stop that producer, or pass --name)") from exc
        except (ValueError, TypeError) as exc:  # an invalid name, say
            raise CliError(str(exc), 2) from exc
        except _C.Error as exc:  # CudaError, say
            raise CliError(describe(exc)) from exc
        serving.append(producer)
        if stop_requested.is_set():  # a signal came while it was being made
            producer.request_stop()
        return _serve(producer, name, epochs, min_consumers, slots, label, refresh,
                      stop_requested, requested, show_traceback)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _serve(producer: Producer, name: str, epochs: int | None,
           min_consumers: int, slots: int, label: str, refresh: float | None,
           stop_requested: threading.Event, requested: list[int], show_traceback: bool) -> int:
    stream = sys.stderr
    tty = stream.isatty()
    if refresh is None:
        refresh = 1.0 if tty else 5.0
    screen = Screen(stream, tty and refresh > 0, epochs)
    logger = logging.getLogger("batchcast")
    log_handler = ScreenLog(screen)
    saved_logging = (logger.level, logger.propagate)
    logger.addHandler(log_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    saved_showwarning = warnings.showwarning

    def show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                     file: TextIO | None = None, line: str | None = None) -> None:
        screen.message(f"{time.strftime('%H:%M:%S')} warning: {category.__name__}: {message}")

    warnings.showwarning = show_warning
    batches_per_epoch = epoch_progress(producer.stats())[1]
    length = f"{batches_per_epoch} batches per epoch" if batches_per_epoch else \
        "epoch length unknown"
    screen.message(
        f"batchcast: serving '{name}' from {label} on {producer.device} ({length}, {slots} slots, "
        f"{f'{epochs} epochs' if epochs else 'until stopped'}; pid {os.getpid()})")
    screen.message(f"batchcast: trainers: batchcast.Consumer({name!r}, batch_size=...); "
                   "Ctrl-C stops")
    started = time.monotonic()
    live = Live(min_consumers)
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
               f"{duration(time.monotonic() - started)}")
    if error is not None and not stop_requested.is_set():
        if show_traceback:
            traceback.print_exception(type(error), error, error.__traceback__)
        raise CliError(f"the loader raised {describe(error)} after {summary} (consumers got "
                       "batchcast.LoaderError)")
    how = "served" if finished else "stopped after"
    try:
        click.echo(f"batchcast: {how} {summary}; '{name}' is free", err=True)
        if error is not None:
            click.echo(f"batchcast: while stopping, the loader raised {describe(error)}",
                       err=True)
    except OSError:  # stderr is gone (a closed terminal): the stop was still clean
        pass
    return 0

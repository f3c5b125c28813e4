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

import json
import os
import sys
import traceback

import click

from ._cli_error import CliError, describe

_SHOW_TRACEBACK = False


def _error_line(message: str) -> None:
    message = " ".join(str(message).split()) or "unknown error"
    click.echo(f"batchcast: error: {message}", err=True)


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
@click.option("--cache", type=click.Choice(["memory", "disk"]), default=None,
              help="Keep each sample the loader decodes in its first epoch and make every later "
                   "epoch from them (the loader's samples must be the same every epoch: random "
                   "augmentation goes in the trainers' transform=). disk: a file the next "
                   "`batchcast serve` of this name over the same data starts from.")
@click.option("--cache-dir", default=None, metavar="DIR",
              help="Where a disk cache lives (with --cache disk). Default: "
                   "$XDG_CACHE_HOME/batchcast or ~/.cache/batchcast.")
@click.option("--cache-key", default="", metavar="TEXT",
              help="What else tells the cached data apart (a version of the decoding, say).")
@click.option("--refresh", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Status refresh interval; 0: no live status. "
                   "Default: 1 on a terminal, 5 otherwise.")
def serve(spec: str, args: tuple[str, ...], name: str | None, device: str, epochs: int | None,
          slots: int, ring_bytes: int, samples_per_epoch: int | None, min_consumers: int,
          straggler_timeout: float | None, cache: str | None, cache_dir: str | None, cache_key: str,
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
    from ._serving import serve as serve_loader
    from .options import Cache

    if (cache_dir is not None or cache_key) and cache is None:
        raise click.UsageError("--cache-dir and --cache-key go with --cache memory|disk")
    try:
        decoded = None if cache is None else Cache(cache, directory=cache_dir, key=cache_key)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    return serve_loader(spec, args, name, device, epochs, slots, ring_bytes, samples_per_epoch,
                        min_consumers, straggler_timeout, refresh, _SHOW_TRACEBACK, decoded)


# ---- status -----------------------------------------------------------------------------


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
    from ._status_text import status_block
    from .status import list_producers

    try:
        listings = list_producers(name, timeout=timeout)
    except ValueError as exc:  # an invalid name
        raise CliError(str(exc), 2) from exc
    except Exception as exc:
        raise CliError(describe(exc)) from exc
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
            lines, table = status_block(listing)
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

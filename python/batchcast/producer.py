"""The producer side: iterates a DataLoader (or any iterable of batches) once
per epoch and publishes every batch once into shared memory."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from typing import Any, Callable, Generator, Iterable, Iterator, cast

from ._cache import DecodedCache, why_not_cached
from ._core import _C
from ._device import parse_device
from ._identity import SampleIndices, why_unknown
from ._in_ring import Leaser, RingTensor, nbytes_of, view_of
from ._loader_watch import LoaderWatch, starting_workers, worker_pids
from ._order import BlockOrder, steering
from ._structure import flatten_after
from .options import Cache

_log = logging.getLogger("batchcast")
# Producers serving from a background thread (start()), stopped before the
# interpreter exits: a daemon thread still running the loader when it does
# is ended mid-call (torch's own calls among them abort the process then).
_serving: "weakref.WeakSet[Producer]" = weakref.WeakSet()
# Open producers of this process by (runtime directory, name): an interactive
# session that runs the cell making a producer again replaces its own old one.
_open: "dict[tuple[str, str], weakref.ref[Producer]]" = {}


def _interactive() -> bool:
    """A notebook, IPython or the Python prompt (where cells are run again).
    A process that merely imported IPython or ipykernel (a test driving a
    kernel, say) is none of these: IPython's shell runs in it only there."""
    import sys

    ipython = sys.modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    in_shell = get_ipython is not None and get_ipython() is not None
    return in_shell or hasattr(sys, "ps1") or bool(sys.flags.interactive)


def _make_way(name: str, runtime_dir: str | None) -> tuple[str, str]:
    """The key of a producer of `name`; an open producer of that name in this
    process is stopped first in an interactive session (a cell run again),
    else refused with what to run."""
    import os

    key = (runtime_dir or os.environ.get("BATCHCAST_RUNTIME_DIR", ""), name)
    old = _open.get(key)
    producer = old() if old is not None else None
    if producer is None or producer._core is None:
        return key
    if not _interactive():
        raise _C.NameInUse(
            f"a batchcast producer named '{name}' is already running in this process (pid "
            f"{os.getpid()}); stop it first (producer.stop()), or give this one another name")
    _log.warning("producer '%s' replaces the one of that name this process started before "
                 "(it is stopped: its consumers get ProducerLost)", name)
    try:
        producer.stop(timeout=10.0)
    except Exception as exc:  # its loader's error: nobody is left to raise it to
        _log.warning("the replaced producer '%s' had failed: %s: %s", name, type(exc).__name__, exc)
    return key


@atexit.register
def _stop_serving_at_exit() -> None:
    for producer in list(_serving):
        if producer._pid != os.getpid():  # a forked child's copy: serving is the parent's
            continue
        try:
            producer.stop(timeout=10.0)
        except BaseException as exc:  # the loader's error, kept for stop(): nobody is left to raise it to
            _log.warning("producer '%s' stopped at exit; its loader had raised %s: %s",
                         producer.name, type(exc).__name__, exc)


class _CannotShare(Exception):
    """The loader yielded what the producer cannot serve (its message says why)."""


def _samples_per_epoch(loader: Any) -> int:
    """Samples the loader yields per epoch, or -1 when it cannot tell in
    advance: a DataLoader's from its batch sampler; a list or tuple of
    batches' by looking at each (they are made already)."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    try:
        if batch_sampler is not None:
            n = len(batch_sampler.sampler)
            size = batch_sampler.batch_size
            return n // size * size if batch_sampler.drop_last else n
    except (AttributeError, TypeError, NotImplementedError):
        pass
    if isinstance(loader, (list, tuple)):
        from ._structure import batch_size

        sizes = [batch_size(b) for b in loader]
        if all(s is not None for s in sizes):
            return sum(s for s in sizes if s is not None)
    return -1


def _loader_identity(loader: Any) -> str:
    """What the loader is, as far as it says: its type, dataset, length,
    batch size, sampler and seed. A consumer's saved state carries it, so
    that a state is never restored against another loader."""
    parts = [f"{type(loader).__module__}.{type(loader).__qualname__}"]
    dataset = getattr(loader, "dataset", None)
    if dataset is not None:
        parts.append(f"dataset={type(dataset).__qualname__}")
    for label, value in (("samples", _samples_per_epoch(loader)),
                         ("batches", _batches_per_epoch(loader))):
        if value >= 0:
            parts.append(f"{label}={value}")
    if getattr(loader, "batch_size", None):
        parts.append(f"batch_size={loader.batch_size}")
    sampler = getattr(loader, "sampler", None)
    if sampler is not None:
        parts.append(f"sampler={type(sampler).__qualname__}")
    generator = getattr(loader, "generator", None) or getattr(sampler, "generator", None)
    if generator is not None and hasattr(generator, "initial_seed"):
        parts.append(f"seed={generator.initial_seed()}")
    return "; ".join(parts)


def _say_lost(name: str, capability: str, instead: str, loader: Any, why: str, fix: str) -> None:
    """Once per producer: a capability its loader does not allow. A WARNING
    where the user can give the producer what it needs (a wrapper of a
    DataLoader, a custom sampler), an INFO where the loader's kind rules it
    out by nature (a list of batches, an IterableDataset)."""
    from torch.utils.data import DataLoader, IterableDataset

    natural = isinstance(loader, (list, tuple)) or (
        isinstance(loader, DataLoader) and isinstance(loader.dataset, IterableDataset))
    if natural:
        _log.info("producer '%s': no %s: %s (%s)", name, capability, instead, why)
    else:
        _log.warning("producer '%s': no %s: %s, because %s; to have it, %s", name, capability,
                     instead, why, fix)


def _plan_of(producer: "weakref.ref[Producer]") -> Callable[[list[int]], list[int]]:
    """The producer's join plan's order of an epoch (its core's order_epoch)."""
    def plan(fresh: list[int]) -> list[int]:
        alive = producer()
        core = None if alive is None else alive._core
        if core is None:
            raise RuntimeError("this DataLoader's batch sampler belongs to a batchcast producer that is closed")
        return core.order_epoch(fresh)
    return plan


def _batches_per_epoch(loader: Any) -> int:
    """Batches the loader yields per epoch (its len()), or -1 when it has none."""
    try:
        return int(len(loader))
    except (TypeError, NotImplementedError):
        return -1


class Producer:
    """Serves the batches of `loader` to every `batchcast.Consumer` of `name`.

    ``run()`` blocks and serves; ``start()``/``stop()`` (or ``with``) serve from a
    background thread. The loader is iterated exactly as a training loop would:
    one ``iter(loader)`` per epoch, nothing extra.

    Example::

        loader = DataLoader(dataset, batch_size=64, num_workers=4)
        bc.Producer(loader, "imagenet", epochs=10).run()      # a process that serves

        with bc.Producer(loader, "demo"):                    # a notebook: serves from a thread
            subprocess.run([sys.executable, "train.py", "--data", "demo"])

    ``device="cpu"`` puts each batch once into host shared memory;
    ``device="cuda:N"`` copies it once into a ring of GPU memory on that GPU,
    shared with every consumer through CUDA IPC (the loader still returns CPU
    tensors). A GPU ring is freed only after every consumer has let go of it:
    ``close()`` waits up to ``linger`` seconds for that. A host ring is
    reopened by consumers through ``/proc``: once every epoch is served,
    ``close()`` waits (normally not at all, at most ``linger``) until every
    consumer told of the ring has mapped it.

    ``pack_fn``, when given, is applied to each batch the loader yields before
    it is published (TensorSocket's ``pack_fn``). It makes every batch anew,
    so a DataLoader's workers then cannot write batches into shared memory
    themselves: each takes the producer's one copy (it says so once).

    What the producer can do depends on what it is given: with the
    DataLoader itself it keeps the loader's order in blocks (consumers join
    mid-epoch at once), lets its workers write into the ring, and knows
    ``len()``. A wrapper of a DataLoader hides all that; the producer logs a
    WARNING naming what is lost and what to pass instead.
    """

    _cache: DecodedCache | None = None  # (set in __init__; here for a close() before it)
    _cache_stats: dict[str, Any] | None = None

    def __init__(
        self,
        loader: Iterable[Any],
        name: str,
        device: str = "cpu",
        epochs: int | None = None,
        *,
        min_consumers: int = 1,
        slots: int = 8,
        ring_bytes: int = 0,
        samples_per_epoch: int | None = None,
        straggler_timeout: float | None = None,
        catch_up_window: int | None = None,
        runtime_dir: str | None = None,
        linger: float = 30.0,
        pack_fn: Callable[[Any], Any] | None = None,
        cache: str | Cache | None = None,
    ) -> None:
        self._pid = os.getpid()  # a forked child's copy of this producer does nothing
        self._core: _C.Producer | None = None
        kind, cuda_device = parse_device(device, "device")
        key = _make_way(name, runtime_dir) if isinstance(name, str) else None
        if epochs is not None and (not isinstance(epochs, int) or epochs < 0):
            raise ValueError(f"epochs must be None (serve until stopped) or an int >= 0, not {epochs!r}")
        if not isinstance(min_consumers, int) or min_consumers < 1:
            raise ValueError(f"min_consumers must be an int >= 1, not {min_consumers!r}")
        if not hasattr(loader, "__iter__"):
            raise TypeError(f"loader must be iterable, not {type(loader).__name__}")
        if pack_fn is not None and not callable(pack_fn):
            raise TypeError(f"pack_fn must be a function of a batch, not {type(pack_fn).__name__}")
        cache_option = Cache.of(cache)
        if cache_option is not None:
            why_no_cache = why_not_cached(loader)
            if why_no_cache is not None:
                raise ValueError(f"producer '{name}' cannot keep a decoded cache of its loader: {why_no_cache}. "
                                 "Pass the DataLoader itself (over a map-style dataset), or leave cache= unset")
        self.loader = loader
        self._pack = pack_fn
        self.name = name
        self.epochs = epochs
        self.min_consumers = min_consumers
        own_samples = _samples_per_epoch(loader)
        if samples_per_epoch is None:
            samples_per_epoch = own_samples
        # Consumers may join mid-epoch (join="now") when the producer
        # can keep the loader's order in blocks (see _order).
        why_not = steering(loader)
        fix = ("pass the DataLoader itself (over a map-style dataset, with shuffle=True or False, "
               "or a SubsetRandomSampler), not a wrapper of it")
        if why_not is None and samples_per_epoch != own_samples:
            why_not = (f"samples_per_epoch={samples_per_epoch} was given, but its DataLoader's "
                       f"epochs have {own_samples} samples")
            fix = "leave samples_per_epoch unset (the DataLoader says it)"
        self.can_join_now = why_not is None and own_samples > 0
        if not self.can_join_now:
            _say_lost(name, "joining mid-epoch",
                      "consumers that join mid-epoch start at the next epoch", loader,
                      why_not or "its loader cannot say how many samples an epoch has", fix)
        # A DataLoader's workers write its batches into the ring themselves
        # (a GPU ring: into its pinned host mirror, copied from there to the
        # GPU): each batch it hands a worker gets a slot, so the ring holds
        # the batches the loader has in flight too (they take no memory of
        # their own then).
        in_place = Leaser.applies(loader)
        if in_place and pack_fn is not None:
            in_place = False
            _say_lost(name, "in-place writes", "each batch takes the producer's one copy", loader,
                      "pack_fn makes a new batch of each one the loader's workers made",
                      "do that work in the dataset's __getitem__ instead, or leave it to the "
                      "trainers")
        in_flight = Leaser.in_flight(loader) if in_place else 0
        self._core = _C.Producer(
            name=name,
            runtime_dir=runtime_dir or "",
            slots=max(int(slots), in_flight),
            ring_bytes=int(ring_bytes),
            samples_per_epoch=int(samples_per_epoch),
            batches_per_epoch=_batches_per_epoch(loader),
            straggler_timeout=None if straggler_timeout is None else float(straggler_timeout),
            catch_up_window=None if catch_up_window is None else int(catch_up_window),
            cuda_device=cuda_device if kind == "cuda" else -1,
            linger=float(linger),
            loader=_loader_identity(loader),
            join_now=self.can_join_now,
            epochs=-1 if epochs is None else int(epochs),
        )
        self.device = "cpu" if kind == "cpu" else f"cuda:{cuda_device}"
        self._order: BlockOrder | None = None
        if self.can_join_now:
            # (through a weak reference: the loader holds the order, and must
            # not keep the producer alive)
            self._order = BlockOrder(getattr(loader, "batch_sampler"), _plan_of(weakref.ref(self)))
            # DataLoader refuses to set batch_sampler after construction; the
            # wrapper keeps its length and attributes (restored by close()).
            object.__setattr__(loader, "batch_sampler", self._order)
        # Each batch is published with its samples' dataset indices where the
        # loader lets the producer know them (_identity); the leases wrap
        # around that, so that the indices noted are the loader's own.
        self._indices: SampleIndices | None = None
        self.indices_unknown = why_unknown(loader)
        if self.indices_unknown is None:
            self._indices = SampleIndices(getattr(loader, "batch_sampler"), name)
            object.__setattr__(loader, "batch_sampler", self._indices)
        else:
            _log.info("producer '%s': consumers know samples by their position in the epoch, not their "
                      "dataset index, because %s", name, self.indices_unknown)
        self._leaser = Leaser(loader, self._core, in_flight) if in_place else None
        # The decoded cache (opt-in): the first epoch keeps what the loader
        # makes; later ones are made from it (see _cache).
        self._cache = None
        self._cache_stats = None
        if cache_option is not None:
            try:
                self._cache = DecodedCache(cache_option, name, loader, self._remake)
            except BaseException:
                self.close()
                raise
        if key is not None:
            _open[key] = weakref.ref(self)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stats: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self._tree: list[Any] | None = None  # the last batch's structure (see flatten)
        self._batches_served = 0  # in whole epochs
        self.epochs_begun = 0  # a consumer joining now starts after these
        self.epochs_served = 0

    def _remake(self, indices: list[int]) -> Any:
        """The batch of these dataset indices as the loader makes it (its
        dataset and collate function, then pack_fn), in this thread."""
        loader = self.loader
        own = self._leaser if self._leaser is not None else loader
        dataset, collate_fn = own.dataset, own.collate_fn  # type: ignore[union-attr]
        getitems = getattr(dataset, "__getitems__", None)
        samples = getitems(list(indices)) if getitems is not None else [dataset[i] for i in indices]
        batch = collate_fn(samples)
        return batch if self._pack is None else self._pack(batch)

    def _cached_batches(self, core: _C.Producer, epoch: int) -> Generator[tuple[Any, ...], None, None]:
        """Epoch `epoch` made from the cache: the batch sampler's order (the
        join plan's, noted for the samples' identities, as the loader's own),
        each batch gathered into a leased ring slot (else into tensors of its
        own, which publish copies)."""
        cache, sampler = self._cache, self._indices
        assert cache is not None and sampler is not None
        cache.same_draws_as_an_epoch_of(self.loader)
        for number, asked in enumerate(sampler):
            indices = sampler.take(len(asked), epoch, number)
            if indices is None:  # (keys, not integers: the cache was refused for such a sampler)
                raise RuntimeError("a cached epoch's batch sampler yielded indices that are not integers")
            lease = self._lease_for_cache(core)
            place = (lambda k, shape, dtype: None) if lease is None else lease[1]
            got = cache.batch(indices, place)
            if got is None:  # samples its first epoch left out: made here, as the loader would
                if lease is not None:
                    core.return_lease(lease[0])
                leaves, layout, samples, self._tree = cache.remade(indices, self._tree)
                yield leaves, layout, samples, None, False, indices
                continue
            leaves, layout, samples, placed = got
            if lease is not None and not placed:
                core.return_lease(lease[0])
                lease = None
            yield leaves, layout, samples, None if lease is None else lease[0], placed, indices

    def _lease_for_cache(self, core: _C.Producer) -> tuple[int, Callable[..., Any]] | None:
        """A ring slot to gather a cached batch into, and where each of its
        tensor leaves goes (None: no lease to be had, or the ring's host
        memory cannot be pinned)."""
        try:
            got = core.lease(1)
        except _C.CudaError:
            return None
        if got is None:
            return None
        seq, _fd, _ring_bytes, offsets, sizes = got
        ring = core.host_ring()
        lanes: dict[int, int] = {}

        def place(leaf: int, shape: Any, dtype: Any) -> Any:
            lane = lanes.setdefault(leaf, len(lanes))
            if ring is None or lane >= len(offsets):
                return None
            placed = RingTensor(offsets[lane], tuple(shape), dtype)
            if nbytes_of(placed) > sizes[lane] or placed.offset % dtype.itemsize != 0:
                return None
            return view_of(ring, placed)

        return seq, place

    # ---- serving ----------------------------------------------------------
    def run(self) -> None:
        """Serves every epoch, then returns. Raises what the loader raised."""
        self._check_open()
        try:
            self._serve()
        finally:
            self.close()

    def _serve(self) -> None:
        # None once closed: then the AttributeError a call on None raises, as ever.
        core = cast("_C.Producer", self._core)
        try:
            core.wait_for_consumers(self.min_consumers)
            epoch = 0
            while self.epochs is None or epoch < self.epochs:
                for _ in self._serve_epoch(core, epoch):
                    pass
                epoch += 1
        except _C.Stopped:
            pass
        core.finish()

    def _serve_epoch(self, core: _C.Producer, epoch: int) -> Iterator[None]:
        """Serves epoch `epoch`, yielding after each published batch (so that
        batchcast.compat.tensorsocket can hand the loop to its caller)."""
        core.wait_for_consumers(1)
        self.epochs_begun = epoch + 1
        core.begin_epoch(epoch)
        cache = self._cache
        if cache is not None and cache.serves(epoch):
            yield from self._serve_cached_epoch(core, epoch)
            return
        # The loader's workers (forked now, from this thread) end with this
        # process whatever they are doing; a wait for the loader is watched.
        with starting_workers():
            iterator = iter(self.loader)
        workers = worker_pids(iterator)
        watch = LoaderWatch(core, self.name, lambda: workers)
        leaser = self._leaser
        batches = 0
        # Serving until stopped, nobody present: the loader is not asked for
        # more until someone comes (the epoch goes on from there).
        pause = self.epochs is None
        try:
            while True:
                if pause and batches > 0:
                    core.wait_for_consumers(1)
                try:
                    batch = next(iterator)
                except StopIteration:
                    break
                if self._stop.is_set():
                    raise _C.Stopped("producer stopped")
                if self._pack is not None:
                    batch = self._pack(batch)
                lease, in_place = None, False
                if leaser is not None:
                    batch, lease, in_place = leaser.unpack(batch)
                try:
                    leaves, layout, samples, self._tree = flatten_after(batch, self._tree)
                    indices = None if self._indices is None else self._indices.take(samples, epoch, batches)
                    if cache is not None:  # (before publishing: a slot's rows are the consumers' then)
                        cache.record(leaves, layout, samples, indices)
                    core.publish(leaves, layout, samples, lease, in_place, indices)
                except (TypeError, ValueError) as exc:  # a batch it cannot share
                    raise _CannotShare(f"loader batch {batches}: {exc}") from exc
                del batch, leaves  # views of the ring: none outlives the producer
                batches += 1
                if leaser is not None:
                    leaser.published()
                yield None
            if leaser is not None:
                leaser.epoch_done()
            if cache is not None:
                cache.epoch_ended()
            if batches == 0 and self._batches_served > 0:
                raise _CannotShare(
                    f"the loader yielded no batch in epoch {epoch}, after {self._batches_served} "
                    "in the epochs before: a generator (or any other iterator) can be iterated only "
                    "once. Give the Producer something that makes a new iterator per epoch (a "
                    "DataLoader, a list, or a class whose __iter__ returns a new generator), or "
                    "serve one epoch (epochs=1)")
        except _C.Stopped:
            raise
        except Exception as exc:
            self._failed(core, exc, f"what its loader yielded in epoch {epoch}")
            raise
        finally:
            watch.close()
            del iterator  # shuts DataLoader workers down as a loop would
        core.note_loader_workers([])
        self._epoch_served(core, epoch, batches)

    def _failed(self, core: _C.Producer, exc: Exception, what: str) -> None:
        """Says why serving stopped (`exc`, raised making a batch of `what`) to
        the consumers; raises what the caller raises instead, if anything."""
        if self._stop.is_set():
            # Stopping (a Ctrl-C may also reach spawned loader workers):
            # consumers hear that the producer stopped, not a loader error.
            raise _C.Stopped("producer stopped") from exc
        if isinstance(exc, _CannotShare):
            core.fail(str(exc), cannot_share=True)
            raise _C.LoaderError(f"batchcast producer '{self.name}' cannot serve {what}: {exc}") from exc.__cause__
        core.fail(f"{type(exc).__name__}: {exc}")

    def _epoch_served(self, core: _C.Producer, epoch: int, batches: int) -> None:
        core.end_epoch()
        self._batches_served += batches
        self.epochs_served = epoch + 1

    def _serve_cached_epoch(self, core: _C.Producer, epoch: int) -> Iterator[None]:
        """Serves epoch `epoch` from the decoded cache (no loader), yielding
        after each published batch, as _serve_epoch does."""
        batches = 0
        pause = self.epochs is None
        made = self._cached_batches(core, epoch)
        try:
            while True:
                if pause and batches > 0:
                    core.wait_for_consumers(1)
                got = next(made, None)
                if got is None:
                    break
                if self._stop.is_set():
                    raise _C.Stopped("producer stopped")
                leaves, layout, samples, lease, in_place, indices = got
                del got
                try:
                    core.publish(leaves, layout, samples, lease, in_place, indices)
                except (TypeError, ValueError) as exc:
                    raise _CannotShare(f"batch {batches} made from the cache: {exc}") from exc
                del leaves  # views of the ring: none outlives the producer
                batches += 1
                yield None
        except _C.Stopped:
            raise
        except Exception as exc:
            self._failed(core, exc, f"epoch {epoch} from its decoded cache")
            raise
        finally:
            made.close()
        self._epoch_served(core, epoch, batches)

    def start(self) -> "Producer":
        """Serves from a background thread (for notebooks); returns self."""
        self._check_open()
        if self._thread is not None:
            raise RuntimeError("producer already started")

        def target() -> None:
            try:
                self._serve()
            except BaseException as exc:  # kept for stop() / __exit__ to re-raise
                self.error = exc

        self._thread = threading.Thread(target=target, name=f"batchcast-producer-{self.name}",
                                        daemon=True)
        self._thread.start()
        _serving.add(self)
        return self

    def join(self, timeout: float | None = None) -> bool:
        """Waits until a producer serving from ``start()`` (or ``with``) has
        served every epoch, then closes it and raises what its loader raised,
        as ``run()`` would. False if ``timeout`` seconds passed first (it goes
        on serving). Ctrl-C interrupts the wait, not the producer."""
        thread = self._thread
        if thread is None:
            if self._core is not None:
                raise RuntimeError(f"producer '{self.name}' was not started: run() serves in this "
                                   "thread, start() in the background")
            return True  # served, stopped or closed already
        thread.join(timeout)
        if thread.is_alive():
            return False
        self.stop()
        return True

    wait = join

    def _check_open(self) -> None:
        if self._core is None:
            raise RuntimeError(f"producer '{self.name}' is closed (it served, was stopped or "
                               "closed); make a new Producer to serve again")

    def request_stop(self) -> None:
        """Asks a serving producer to stop without waiting for it: the batch
        the loader is making is its last, and whatever the loader raises from
        here on is part of stopping (consumers get ProducerLost, not
        LoaderError). Safe in a signal handler; ``stop()`` then waits."""
        self._stop.set()
        if self._core is not None:
            self._core.stop()

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stops serving (consumers mid-epoch get ProducerLost), frees the name."""
        self._stop.set()
        if self._core is not None:
            self._core.stop()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.close()
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def close(self) -> None:
        """Releases the name, the socket and this process's mapping of the ring."""
        if self._pid != os.getpid():  # a forked child's copy: all of it is the parent's
            self._core = None
            return
        core, self._core = self._core, None
        if self._leaser is not None:
            self._leaser.restore()  # the loader as it was given
            self._leaser = None
        if self._indices is not None:
            object.__setattr__(self.loader, "batch_sampler", self._indices.batch_sampler)
            self._indices = None
        if self._order is not None:
            object.__setattr__(self.loader, "batch_sampler", self._order.batch_sampler)
            self._order = None
        if self._cache is not None:
            self._cache_stats = self._cache.stats()
            self._cache.close()
            self._cache = None
        if core is not None:
            self._stats = core.stats()
            # Waits (up to linger) for consumers to let go of a GPU ring, or,
            # having served everything, to have mapped a host ring.
            core.close()

    def __enter__(self) -> "Producer":
        return self.start() if self._thread is None else self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    def __del__(self) -> None:
        try:
            if self._pid != os.getpid():  # a forked child's copy: serving is the parent's
                return
            self._stop.set()
            if self._core is not None:
                self._core.stop()
        except Exception:
            pass

    @property
    def serving(self) -> bool:
        """Whether the background thread of ``start()`` is still serving (False
        once every epoch was served, the loader raised, or after ``stop()``)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def consumers(self) -> int:
        """Consumers connected right now."""
        return self._core.consumer_count() if self._core is not None else 0

    def stats(self) -> dict[str, Any]:
        """Counters: batches and bytes published, time copying and waiting for
        the slowest consumer, joins, leaves, crashes, dropped messages, and per
        consumer the slots it holds."""
        stats = self._core.stats() if self._core is not None else dict(self._stats or {})
        if self._cache is not None:
            stats.update(self._cache.stats())
        elif self._cache_stats is not None:
            stats.update(self._cache_stats)
        return stats

"""The consumer side: a drop-in replacement for a DataLoader in a training
script. Yields the producer's batches rebatched to this consumer's size."""

from __future__ import annotations

import functools
import os
import threading
from typing import Any, Callable, Iterator, Mapping, TypeVar

from ._core import _C
from ._structure import unflatten
from . import _forks, _state
from ._loader_like import EpochBatches, EpochSamples, WithIndices
from ._transform import Taken, Transform, default_threads
from .options import Augment, Group, Join, Pad, Placement, takes_generator


_T = TypeVar("_T")


def _name_the_line_that_writes() -> None:
    """Host batches are mapped read-only: an in-place write into one ends the
    process with SIGSEGV. Python's faulthandler then prints the writing
    thread's traceback (the file and line), beside the core's message saying
    what happened; it is turned on here unless the program set it up itself."""
    import faulthandler
    import sys

    if faulthandler.is_enabled():
        return
    for stream in (sys.stderr, sys.__stderr__):
        if stream is None:
            continue
        try:
            faulthandler.enable(file=stream, all_threads=False)
            return
        except (AttributeError, ValueError, OSError, RuntimeError):  # no file descriptor (a notebook)
            continue


def _transform_of(augment: Augment, name: str) -> Transform:
    seed = augment.seed
    if seed is None:
        import torch

        # As a DataLoader's base seed: drawn from torch's global generator,
        # so that torch.manual_seed() in the script makes it reproducible.
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
    threads = augment.threads
    if threads is None:
        threads = default_threads() if takes_generator(augment.fn) else 0
    return Transform(augment.fn, seed, threads, name)


def _producer_story(name: str, runtime_dir: str) -> str:
    """What producer `name` is doing, asked over its socket, for a
    ``Stalled`` error: what it waits for, since when, its loader's workers,
    and what to do."""
    from .status import list_producers

    listing: list[dict[str, Any]] = []
    failure: Exception | None = None
    try:
        listing = list_producers(name, runtime_dir=runtime_dir or None, timeout=1.0, clean=False)
    except Exception as exc:  # noqa: BLE001 (the story is told with what there is)
        failure = exc
    status = listing[0]["status"] if listing else None
    look = f"`batchcast status {name}` shows the producer"
    if status is None:
        why = f" ({failure})" if failure is not None else (f" ({listing[0]['note']})" if listing and
                                                             listing[0].get("note") else "")
        return (f"The producer did not answer a status request within 1 s{why}: it may be hung or gone. "
                f"Look at its process; {look}.")
    waiting, seconds = status.get("waiting_for") or "", float(status.get("waiting_seconds") or 0)
    epoch, batches = status.get("epoch"), status.get("epoch_batches")
    pid = status.get("pid")
    if waiting == "loader":
        workers = [int(p) for p in status.get("loader_workers") or []]
        if workers:
            who = (f"its loader's worker processes alive: {', '.join(map(str, workers))} "
                   f"(`py-spy dump --pid {workers[0]}` shows where one is)")
        else:
            who = (f"no worker process of its loader is alive: it loads in the producer's process "
                   f"(`py-spy dump --pid {pid}` shows where)")
        return (f"The producer (pid {pid}) has waited {seconds:.1f} s for its loader's next batch "
                f"(epoch {epoch}, after {batches} batches of it); {who}. A worker may be stuck on a file "
                f"system, a lock or a remote read: fix the loader, or raise stall_timeout if its batches "
                f"are this slow; {look}.")
    if waiting == "consumers":
        stuck = status.get("stuck") or ""
        return (f"The producer (pid {pid}) has waited {seconds:.1f} s for ring space that other consumers "
                f"hold{': ' + stuck if stuck else ''}; every trainer of it waits for the slowest (its "
                f"straggler_timeout evicts one). {look}.")
    if waiting == "joins":
        return (f"The producer (pid {pid}) waits for {status.get('consumers_wanted')} more consumers before "
                f"it begins (min_consumers). Start them, or lower min_consumers; {look}.")
    return (f"The producer (pid {pid}) waits for nothing now (epoch {epoch}, {batches} batches of it "
            f"published): batches may just have resumed; {look}.")


class Consumer:
    """Iterate it like a DataLoader: each ``iter()`` is one epoch.

    Example::

        loader = bc.Consumer("imagenet", batch_size=96)   # was: DataLoader(...)
        for epoch in range(10):
            for images, labels in tqdm(loader):           # len(loader): batches per epoch
                loss = model(images) ...

    ``batch_size`` is this trainer's own; without one, the producer's loader
    batches arrive as they are (``len()`` is the loader's). ``len()`` is the
    number of batches in an epoch; it raises ``TypeError`` (which ``tqdm`` and
    ``operator.length_hint`` take as "unknown") while the producer's loader has no
    length and its first epoch has not ended.

    Tensors are read-only views of shared memory (modify copies, not them); they
    stay valid for as long as you hold them, and the producer reuses their
    memory only after every consumer has dropped them. Keeping many batches is
    fine, as with a DataLoader: once what you keep pins more than this
    consumer's share of the producer's ring, new batches arrive as private
    copies instead (a ``batchcast.KeptBatchesWarning`` says so once), so that
    nobody waits for you.

    ``device`` says where batches arrive: by default where the producer put
    them (host shared memory, or the producer's GPU: zero-copy, the current
    CUDA stream waits for the producer's copy, and the memory is reused once
    that stream is past your last use of it); ``"cuda:K"`` on another GPU
    (one GPU-to-GPU copy per loader batch), ``"cpu"`` from a GPU producer (one
    device-to-host copy). ``bc.Placement(device, release_after=...,
    writable=..., shared_gpu_views=...)`` says more: when a GPU batch's memory
    goes back, private copies you may modify, or the producer's GPU memory
    shared as views. ``stats()`` says what was chosen.

    ``join`` says where a consumer that connects mid-epoch starts: ``"now"``
    (the default) with the next batch the producer publishes, with epochs of
    its own, each the next ``samples_per_epoch`` samples from where it joined
    and each holding every sample exactly once (see docs/sweeps.md,
    "Joining mid-epoch"); ``"next_epoch"``; or ``"catch_up"``, the current epoch from its
    start while its first batches are still retained. ``bc.Join(when,
    past_last_epoch=..., runtime_dir=...)`` also says what an epoch asked for
    after the producer's last one does, and where the producer is found.
    ``stats()["joined_at"]`` says where its epochs begin in the
    producer's (0: they are the producer's).

    ``group=bc.Group(name, rank, world_size)`` makes this consumer one rank of
    a data-parallel trial (a DDP job): of each ``world_size * batch_size``
    consecutive samples of the stream, rank r takes the r-th ``batch_size``,
    so the ranks together see the epoch once while whole-stream consumers
    beside them see all of it (``group="name"`` takes rank and world size
    from ``torch.distributed``). Every rank gets the same number of batches:
    the last, partial window is padded up to a multiple of ``world_size`` with
    the epoch's first samples and split evenly (unless ``drop_last``, which
    drops it). The group starts once all its ranks are present, at the next
    epoch, and counts as one consumer; if a rank exits, leaves or is evicted,
    every other rank's next ``next()`` of that epoch raises
    ``batchcast.GroupError``.

    ``pad`` re-pads samples of variable length (speech, text, clips): where
    one batch of this consumer joins loader batches that the loader padded to
    different lengths, each leaf named is padded on the trailing side of each
    dimension its samples differ in to the largest among them, with that
    leaf's value (``pad={"input_ids": 0, "attention_mask": 0, "labels":
    -100}``; a tuple of keys names a leaf deeper inside; one number pads
    every leaf; ``bc.Pad(values, multiple_of=8)`` rounds those dimensions
    up). Samples keep their values; a batch of one loader batch's samples
    stays a view, a re-padded one is one copy (``stats()["repadded"]``). A
    leaf whose shapes differ and that ``pad`` does not name raises
    ``batchcast.RebatchError`` saying so.

    ``transform`` is this trainer's own augmentation of the shared samples
    (the producer's loader decodes and resizes; each trainer augments): a
    function called once per sample, or ``bc.Augment(fn, seed=...,
    threads=...)``; see ``batchcast.Augment`` for its per-sample, reproducible
    randomness. Batches on a GPU are transformed on a side stream. An
    exception in the transform is a ``batchcast.TransformError`` naming the
    sample and the epoch.

    ``with_indices()`` iterates an epoch as ``(batch, indices)``: an int64
    tensor of each sample's identity (its dataset index where the producer
    knows it, else its position in the producer's epoch;
    ``stats()["sample_identity"]`` says which).

    ``stall_timeout`` (seconds; default: none) is how long ``next()`` waits
    for its next batch with no sample from the producer meanwhile before it
    raises ``batchcast.Stalled``, which says how long it waited, what the
    producer was doing (waiting for its loader, for how long, its worker
    processes) and what to do: a hung loader then ends a trial with an error
    instead of a silent wait. The epoch's iterator ends with the error (as a
    DataLoader's does past its ``timeout``); ``state_dict()`` still says
    exactly where the consumer stands. Set it well above the slowest normal
    wait (an epoch's first batch, the other trainers' pace when the producer
    waits for ring space).

    ``state_dict()`` is where the consumer stands (epoch, and position in the
    producer's stream), as torchdata's ``StatefulDataLoader`` has it;
    ``Consumer(..., state=saved)`` or ``load_state_dict(saved)`` continues from
    there: exactly, while the producer still holds that position (other
    consumers still use it, or it is among an epoch's first ``catch_up_window``
    batches), and otherwise with the same positions of the producer's next
    pass (a ``batchcast.ResumeWarning`` says so; ``stats()["resumed"]`` says
    which). A state names the producer's run: against a producer restarted
    since, a state saved mid-epoch resumes with those positions of the new
    run's pass (warned), one saved between epochs with the next epoch, whole. A state saved from another loader or another configuration is a
    ``ValueError``.
    """

    def __init__(
        self,
        name: str,
        batch_size: int | None = None,
        *,
        drop_last: bool = False,
        timeout: float = 30.0,
        device: Any = None,
        state: dict[str, Any] | None = None,
        transform: Callable[..., Any] | Augment | None = None,
        pad: float | Mapping[Any, float] | Pad | None = None,
        group: str | Group | None = None,
        join: str | Join = "now",
        stall_timeout: float | None = None,
    ) -> None:
        self._pid = os.getpid()  # a forked child's copy of this consumer is not usable
        self._core: _C.Consumer | None = None
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                       or not 0 < batch_size < 2**63):
            raise ValueError(f"batch_size must be a positive int (or None), not {batch_size!r}")
        if stall_timeout is not None and (isinstance(stall_timeout, bool)
                                          or not isinstance(stall_timeout, (int, float))
                                          or not 0 < stall_timeout <= 1e9):
            raise ValueError(f"stall_timeout must be a positive number of seconds (or None: wait for ever), "
                             f"not {stall_timeout!r}")
        joining, placement, padding = Join.of(join), Placement.of(device), Pad.of(pad)
        ranks, augment = Group.of(group), Augment.of(transform)
        if ranks is not None and batch_size is None:
            raise ValueError("a consumer group needs batch_size= (each rank's batch size)")
        if padding is not None and batch_size is None:
            raise ValueError(
                "pad= re-pads samples that one batch of this consumer joins from several loader batches; "
                "without batch_size= the loader's batches arrive as they are, padded as the loader made "
                "them: give a batch_size, or leave pad out")
        self.name = name
        self.batch_size = batch_size
        self.drop_last = bool(drop_last)
        self.group: str | None = None if ranks is None else ranks.name
        self.rank: int | None = None if ranks is None else ranks.rank
        self.world_size: int | None = None if ranks is None else ranks.world_size
        self._seed_given = augment is not None and augment.seed is not None
        self._transform = None if augment is None else _transform_of(augment, name)
        # The producer's epoch this consumer's epoch 0 began in (its epochs
        # are counted from there: a transform's seeds use that count).
        self._epoch_zero: int | None = None
        self._resumed_number = 0  # the epoch number a restored state was in
        self._core_lock = threading.Lock()
        # _C.Consumer's keywords (its options list; kept to reconnect): each
        # option object says what it means to the core.
        self._options: dict[str, Any] = dict(
            name=name, batch_size=batch_size, drop_last=self.drop_last, timeout=float(timeout),
            stall_timeout=float(stall_timeout or 0),
            **joining._core(), **placement._core(),
            **({} if ranks is None else ranks._core()),
            **({} if padding is None else padding._core()))
        _name_the_line_that_writes()
        self._stats: dict[str, Any] | None = None
        # The fork guard's turn (_forks): connecting, this thread waits inside
        # the consumer (a producer of this process may fork its workers
        # meanwhile; one that answers joins between its forks must not wait
        # for it); from the constructor's return it runs its own code, and a
        # fork waits for it to come back for a batch.
        self._turn = _forks.Turn(f"the consumer of '{name}'")
        try:
            self._connect(state)
        except BaseException:
            self._turn.close()
            raise
        self._turn.resume()

    def _connect(self, state: dict[str, Any] | None) -> None:
        self._core = self._open(state)

    def _open(self, state: dict[str, Any] | None) -> _C.Consumer:
        resume: _state.Resume = {}
        if state is not None:
            self._check_state(state)
            self._epoch_zero = None
            self._resumed_number = int(state.get("epoch_number", 0))
            if self._transform is not None and state.get("seed") is not None:
                self._transform.seed = int(state["seed"])
            resume = _state.resume_from(state)
        core = _C.Consumer(**self._options, **resume)
        other = _state.other_loader(state, self.name, core.stats()["loader"])
        if other is not None:
            core.close()
            raise ValueError(other)
        return core

    def _check_state(self, state: dict[str, Any]) -> None:
        mine = {"producer": self.name, "batch_size": self.batch_size, "drop_last": self.drop_last,
                "group": self.group, "rank": self.rank, "world_size": self.world_size}
        if self._transform is not None and self._seed_given and state.get("seed") is not None:
            mine["seed"] = self._transform.seed
        _state.check(state, mine)

    def state_dict(self) -> dict[str, Any]:
        """Where this consumer stands, for ``load_state_dict`` or ``state=``:
        the producer's epoch it is in (between epochs, the next one) and the
        stream position of the first sample it has not taken, with what it
        consumes (producer, batch size, group and rank) and the producer's
        loader. Plain data: save it with the trial's checkpoint."""
        core = self._live()
        with self._core_lock:
            epoch, position = self._handed or core.position()
            stats = core.stats()
        return _state.saved(
            producer=self.name, epoch=epoch if epoch >= 0 else None, position=int(position),
            joined_at=int(stats["joined_at"]),
            epoch_number=self._number_of(epoch) if epoch >= 0 else self._resumed_number,
            seed=None if self._transform is None else self._transform.seed,
            batch_size=self.batch_size, drop_last=self.drop_last,
            group=self.group, rank=self.rank, world_size=self.world_size,
            loader=stats["loader"], run=int(stats["run"]))

    @property
    def _handed(self) -> tuple[int, int] | None:
        """Where the consumer stands with the batch it handed out while its
        transform fetches the next one ahead (None: where the core stands)."""
        return None if self._transform is None else self._transform.handed

    def _number_of(self, epoch: int) -> int:
        """This consumer's own count of the epoch that begins in (or lies
        in) the producer's epoch `epoch`: 0 for its first, whenever it joined,
        and after a resume the count of the epoch it was saved in."""
        if self._epoch_zero is None:
            return self._resumed_number
        return epoch - self._epoch_zero

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from a ``state_dict()``: rejoins the producer there (see the
        class documentation for what happens when it no longer holds it)."""
        self._check_state(state)
        self._drop_ahead()
        core, self._core = self._live(), None
        self._turn.wait()  # (rejoining: inside the consumer, as connecting is)
        try:
            core.close()
            self._connect(state)
        finally:
            self._resume_turn()

    def __iter__(self) -> Iterator[Any]:
        return self._iterate(indices=False)

    def with_indices(self) -> "WithIndices":
        """This consumer's epochs as ``(batch, indices)``: iterating it is
        one epoch (as iterating the consumer is), each batch with an int64
        tensor of its samples' identities (``stats()["sample_identity"]``
        says whether dataset indices or positions in the producer's epoch)."""
        return WithIndices(self)

    def _iterate(self, indices: bool) -> Iterator[Any]:
        core = self._live()
        self._drop_ahead()
        self._turn.wait()  # (a group's rank waits here for its group)
        try:
            epoch = core.begin_epoch()
        finally:
            self._resume_turn()
        if self._epoch_zero is None:
            self._epoch_zero = epoch - self._resumed_number
        if self._transform is None and not indices:
            return self._epoch(core)
        return self._epoch_of(core, epoch - self._epoch_zero, indices)

    # While the thread that iterates an open consumer runs its own code (it
    # has a batch, an epoch ended, or it has not asked yet), it may run torch
    # ops: a fork of this process waits until it is back here, waiting for a
    # batch (_forks.Turn: a DataLoader worker forked meanwhile could copy a
    # torch lock held).
    def _resume_turn(self) -> None:
        self._turn.resume()
        if self._core is None:  # closed meanwhile (close() ends the turn after it lets go)
            self._turn.close()

    def _epoch(self, core: _C.Consumer) -> Iterator[Any]:
        while True:
            self._turn.wait()
            try:
                item = self._told(core.next)
            finally:
                self._resume_turn()
            if item is None:
                break
            layout, leaves, _ = item
            yield unflatten(layout, leaves)

    def _epoch_of(self, core: _C.Consumer, number: int, indices: bool) -> Iterator[Any]:
        """An epoch with the transform applied and/or the indices handed out
        (the transform fetches its batches, one ahead with threads)."""
        take = functools.partial(self._take, core)
        work = self._transform
        batches = iter(self._untransformed(take) if work is None else work.epoch(take, number))
        while True:
            self._turn.wait()
            try:
                got = next(batches, None)
            finally:
                self._resume_turn()
            if got is None:
                break
            batch, ids = got
            yield (batch, ids) if indices else batch

    @staticmethod
    def _untransformed(take: Callable[[], Taken | None]) -> Iterator[tuple[Any, Any]]:
        while (got := take()) is not None:
            yield unflatten(got.layout, got.leaves), got.ids

    def _take(self, core: _C.Consumer) -> Taken | None:
        """The next batch from the core, with its samples' identities and
        where the consumer then stands."""
        with self._core_lock:
            item = self._told(lambda: core.next(indices=True))
            if item is None:
                return None
            layout, leaves, samples, ids, indexed = item
            return Taken(layout, leaves, samples, ids, indexed, core.position())

    def _told(self, fetch: Callable[[], _T]) -> _T:
        """`fetch()` (the core's next()); a ``Stalled`` from it is told with
        what the producer was doing then."""
        try:
            return fetch()
        except _C.Stalled as exc:
            story = _producer_story(self.name, self._options["runtime_dir"])
            raise _C.Stalled(f"{exc}. {story}") from None

    def _drop_ahead(self) -> None:
        """Discards a batch fetched ahead (the epoch was left, or the
        consumer restarts or closes)."""
        if self._transform is not None:
            self._transform.drop_ahead()

    def __len__(self) -> int:
        n = self._live().batches_per_epoch
        if n < 0:
            raise TypeError(
                f"the length of consumer '{self.name}' is unknown until the producer's first "
                "epoch ends (its loader does not say how many samples an epoch has); pass "
                "samples_per_epoch= to the Producer (batchcast serve --samples-per-epoch N)"
            )
        return n

    # ---- what training code reads of a DataLoader ---------------------------
    # Frameworks and scripts read these of the loader they are given; each
    # holds what is true of this consumer (its batches come ready from the
    # producer: no workers, no collate, no pinning in this process).
    num_workers = 0
    collate_fn = None
    pin_memory = False
    pin_memory_device = ""
    generator = None
    persistent_workers = False
    prefetch_factor = None
    worker_init_fn = None
    multiprocessing_context = None

    @property
    def dataset(self) -> "EpochSamples":
        """The samples of one epoch as this consumer sees them: ``len()`` is the
        samples per epoch (what a DataLoader's ``len(loader.dataset)`` is);
        the samples themselves live in the producer, so indexing is a TypeError."""
        return EpochSamples(self)

    @property
    def sampler(self) -> "EpochSamples":
        """Sized like the samples this consumer gets per epoch (a group's rank:
        its part, as a DistributedSampler's length is); ``set_epoch()`` (as
        DDP scripts call) is accepted and does nothing: the producer's loader
        orders the samples."""
        return EpochSamples(self, share=True)

    @property
    def batch_sampler(self) -> "EpochBatches":
        """Sized like the epoch's batches, with this consumer's batch_size and drop_last."""
        return EpochBatches(self)

    def __bool__(self) -> bool:
        # Always true, as an object: `if loader:` must not ask for a length
        # that may still be unknown (see __len__).
        return True

    def _live(self) -> _C.Consumer:
        if self._pid != os.getpid():
            raise _C.Error(
                f"consumer of '{self.name}' was made by process {self._pid}; process {os.getpid()} is a "
                "fork of it (a DataLoader worker, a multiprocessing pool) and cannot use it: its "
                "connection, threads and batches are the parent's. Make a new Consumer in the child")
        if self._core is None:
            raise RuntimeError(f"consumer of '{self.name}' is closed")
        return self._core

    def close(self) -> None:
        """Leaves the producer. Tensors already handed out stay valid."""
        turn = getattr(self, "_turn", None)
        if getattr(self, "_pid", None) != os.getpid():
            # A forked child's copy (or a consumer never made): the connection,
            # the threads and what they fetched are the parent's; nothing of
            # them is waited for, closed or given back here.
            self._core = self._transform = None
            if turn is not None:
                turn.close()
            return
        if self._transform is not None:
            self._transform.close()  # what is ahead dropped, its threads ended
        core, self._core = self._core, None
        if turn is not None:
            turn.close()
        if core is not None:
            self._stats = core.stats()
            core.close()

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def stats(self) -> dict[str, Any]:
        """Counters: batches and samples received, views vs copies, slots held,
        dropped malformed messages; the device batches arrive on, how they get
        there (``transfer``) and the CUDA IPC handles opened (once, at join)."""
        if self._core is None:
            return dict(self._stats or {})
        with self._core_lock:
            return self._core.stats()

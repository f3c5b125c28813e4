"""A consumer's own transform of the shared samples: decode once in the
producer, augment per trainer.

Each sample of a batch is passed to the trainer's function on its own, with
a ``torch.Generator`` seeded from (the consumer's seed, the consumer's epoch,
the sample's identity): its dataset index where the producer knows it, else
its position in the producer's epoch. So a sample's augmentation in an epoch
is the same whatever the batch size, wherever the trainer joined, and after a
resume; different seeds give different ones; samples of one batch draw
independently. The results are collated as a DataLoader's default collate
would (tensors stacked, numbers made tensors, strings listed), written straight
into the batch's tensors by the threads that made them.

A function with a parameter named ``generator`` runs on ``threads`` threads
(torch ops release the GIL). One without draws from torch's global generator:
it is seeded per sample (the caller's state saved and restored around each)
and so runs one sample at a time, in the thread that asks for the batch (and
one at a time across the process: the global generator is one per process).

With threads, one batch is fetched and transformed ahead of the training
loop (from an epoch's second batch on), on a fetch thread of its own.

Batches on a GPU are transformed on a side stream of their device. Its order:
the side stream waits for the stream that took the batch (the training loop's
current stream; for a batch fetched ahead, the side stream itself, so nothing:
it never waits for the training loop's work), the transform's work is queued
on it, and the stream that asks for the batch waits on an event recorded on
the side stream after that work, before it gets the batch.
"""

from __future__ import annotations

import concurrent.futures as futures
import concurrent.futures.thread  # noqa: F401  (its exit hook is registered before ours)
import contextlib
import os
import threading
from typing import Any, Callable, ContextManager, Iterator, NamedTuple

import torch

from . import _forks
from ._core import _C
from ._structure import sample_of, tree_of, unflatten
from .options import takes_generator

_MASK = (1 << 64) - 1

# The interpreter is exiting: transform threads stop at their next sample
# (Python joins them at exit, after the chunk of samples each is working on;
# registered after concurrent.futures' own hook, so run before it).
_exiting = False


def _at_exit() -> None:
    global _exiting
    _exiting = True


try:
    threading._register_atexit(_at_exit)  # type: ignore[attr-defined]
except RuntimeError:  # imported while the interpreter exits: nothing left to stop
    _exiting = True

# torch's global generator is one per process: transforms that draw from it
# (seeded per sample, the caller's state restored) run one at a time.
_GLOBAL_GENERATOR = threading.Lock()


@contextlib.contextmanager
def _global_generators_seeded(seed: int, cuda: Any) -> Iterator[None]:
    """torch's global CPU generator (and the global generator of GPU `cuda`,
    for a batch there) seeded with `seed`, their states restored after.

    The generators themselves, not torch.manual_seed or torch.random.fork_rng:
    those also seed (or restore) every other device type's generators through
    calls that hold a Python lock of torch's while they format a stack trace
    (torch.mtia's and torch.cuda's lazy seeding). A DataLoader worker forked
    by another thread at that moment inherits that lock held, and waits for it
    for ever in its own torch.manual_seed."""
    generators = [torch.default_generator]
    if cuda is not None:
        index = cuda.index if cuda.index is not None else torch.cuda.current_device()
        if not torch.cuda.default_generators:
            torch.cuda.init()
        generators.append(torch.cuda.default_generators[index])
    saved = [g.get_state() for g in generators]
    for g in generators:
        g.manual_seed(seed)
    try:
        yield
    finally:
        for g, state in zip(generators, saved):
            g.set_state(state)


def _mix(x: int) -> int:
    """splitmix64's finalizer: 64 well-mixed bits of x."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def sample_seed(seed: int, epoch: int, identity: int) -> int:
    """The seed of one sample's generator: a function of the consumer's seed,
    its epoch and the sample's identity, nothing else."""
    return _mix(_mix(_mix(seed & _MASK) ^ (epoch & _MASK)) ^ (identity & _MASK))


class TransformError(_C.Error):
    """A consumer's transform raised on a sample; the message names the
    sample (its dataset index, or its position in the epoch) and the epoch,
    and the original exception is its ``__cause__``."""

    def __init__(self, message: str, identity: int, epoch: int) -> None:
        super().__init__(message)
        self.identity = identity
        self.epoch = epoch


def default_threads() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


# ---- one sample in, one sample out -------------------------------------------

def _shape_of(result: Any) -> Any:
    """What a transformed sample is made of: its containers, and for each
    leaf ("tensor", shape, dtype, device), ("number", type) or ("value",)."""
    if isinstance(result, torch.Tensor):
        return ("tensor", tuple(result.shape), result.dtype, result.device)
    if isinstance(result, bool):
        return ("number", bool)
    if isinstance(result, int):
        return ("number", int)
    if isinstance(result, float):
        return ("number", float)
    if isinstance(result, dict):
        return ("dict", tuple(result), tuple(_shape_of(v) for v in result.values()))
    if isinstance(result, tuple) and hasattr(type(result), "_fields"):
        return ("namedtuple", type(result), tuple(_shape_of(v) for v in result))
    if isinstance(result, (tuple, list)):
        return (type(result).__name__, len(result), tuple(_shape_of(v) for v in result))
    return ("value",)


def _leaves_of(result: Any, out: list[Any]) -> list[Any]:
    """The leaves of a transformed sample, in _shape_of's order."""
    if isinstance(result, dict):
        for v in result.values():
            _leaves_of(v, out)
    elif isinstance(result, (tuple, list)):
        for v in result:
            _leaves_of(v, out)
    else:
        out.append(result)
    return out


def _describe(shape: Any) -> str:
    kind = shape[0]
    if kind == "tensor":
        return f"a tensor of shape {list(shape[1])} {str(shape[2]).replace('torch.', '')} on {shape[3]}"
    if kind == "number":
        return {"int": "an int", "float": "a float", "bool": "a bool"}[shape[1].__name__]
    if kind == "value":
        return "a value"
    if kind == "dict":
        return "{" + ", ".join(f"{k!r}: {_describe(s)}" for k, s in zip(shape[1], shape[2])) + "}"
    inner = ", ".join(_describe(s) for s in shape[2])
    return f"({inner})" if kind != "list" else f"[{inner}]"


class _Collated:
    """The batch the transformed samples are written into: made from the
    first sample that finishes, filled row by row by the threads."""

    def __init__(self, samples: int) -> None:
        self.samples = samples
        self.lock = threading.Lock()
        self.shape: Any = None
        self.first: int = -1  # the sample the structure was taken from
        self.tensors: list[torch.Tensor | None] = []
        self.values: list[list[Any] | None] = []
        self.template: Any = None

    def place(self, i: int, result: Any, name: Callable[[int], str]) -> None:
        shape = _shape_of(result)
        with self.lock:
            if self.shape is None:
                self.shape, self.first, self.template = shape, i, result
                for leaf in _leaves_of(result, []):
                    if isinstance(leaf, torch.Tensor):
                        self.tensors.append(torch.empty((self.samples, *leaf.shape), dtype=leaf.dtype,
                                                        device=leaf.device))
                        self.values.append(None)
                    else:
                        self.tensors.append(None)
                        self.values.append([None] * self.samples)
        if shape != self.shape:
            raise TypeError(
                f"the transform returned {_describe(shape)} for {name(i)}, but {_describe(self.shape)} for "
                f"{name(self.first)}: samples of one batch need one structure, and tensors one shape and "
                "dtype (crop or resize to a fixed size in the transform)")
        for k, leaf in enumerate(_leaves_of(result, [])):
            target = self.tensors[k]
            if target is not None:
                target[i].copy_(leaf)
            else:
                values = self.values[k]
                assert values is not None
                values[i] = leaf

    def batch(self) -> Any:
        leaves: list[Any] = []
        for target, values in zip(self.tensors, self.values):
            if target is not None:
                leaves.append(target)
            else:
                assert values is not None
                first = values[0]
                # As default_collate: numbers become a tensor (floats as
                # float64), the rest a list.
                if isinstance(first, float):
                    leaves.append(torch.tensor(values, dtype=torch.float64))
                elif isinstance(first, int):
                    leaves.append(torch.tensor(values))
                else:
                    leaves.append(values)
        it = iter(leaves)
        return _rebuild(self.template, it)


def _rebuild(template: Any, leaves: Any) -> Any:
    if isinstance(template, dict):
        return {k: _rebuild(v, leaves) for k, v in template.items()}
    if isinstance(template, tuple) and hasattr(type(template), "_fields"):
        return type(template)(*(_rebuild(v, leaves) for v in template))
    if isinstance(template, (tuple, list)):
        return type(template)(_rebuild(v, leaves) for v in template)
    return next(leaves)


class SideStreams:
    """The transform's side stream on each GPU, and the stream order around
    it; every CUDA call of the transform is here.

    For one batch: the side stream waits for the stream that took it
    (`follow`, as the batch's transform starts), the transform's work is
    queued on the side stream (`on`, in the threads that run it), and the
    stream that asks for the batch waits on an event recorded on the side
    stream after that work (`hand_over`)."""

    def __init__(self) -> None:
        self._streams: dict[Any, Any] = {}

    def gpu_of(self, leaves: list[Any]) -> Any:
        """The GPU a batch's tensors are on, or None (a batch on the host)."""
        return next((t.device for t in leaves if isinstance(t, torch.Tensor) and t.is_cuda), None)

    def side(self, device: Any) -> Any:
        """The side stream of GPU `device` (made once)."""
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        return stream

    def in_use(self) -> Any:
        """The side stream it has worked on, or None (it has had no GPU batch)."""
        return next(iter(self._streams.values()), None)

    def on(self, stream: Any) -> ContextManager[Any]:
        """`stream` (and its GPU) made this thread's current one; nothing for None."""
        if stream is None:
            return contextlib.nullcontext()
        both = contextlib.ExitStack()
        both.enter_context(torch.cuda.device(stream.device))
        both.enter_context(torch.cuda.stream(stream))
        return both

    def follow(self, side: Any, device: Any) -> None:
        """The side stream waits for the work queued so far on this thread's
        current stream of `device`, the one that took the batch (for a batch
        taken on the side stream itself, nothing to wait for)."""
        taken_on = torch.cuda.current_stream(device)
        if taken_on != side:
            side.wait_stream(taken_on)

    def hand_over(self, side: Any, device: Any, tensors: list[torch.Tensor]) -> None:
        """This thread's current stream of `device`, the one that asks for the
        batch, waits on an event recorded on the side stream now (its batch's
        work is queued); `tensors`, made on the side stream, are then in use
        on the asking stream (the allocator must not hand their memory out
        again before it is past them)."""
        done = torch.cuda.Event()  # type: ignore[no-untyped-call]
        done.record(side)
        current = torch.cuda.current_stream(device)
        current.wait_event(done)
        for t in tensors:
            t.record_stream(current)


class Taken(NamedTuple):
    """A batch as the consumer takes it from its core, and where the
    consumer then stands (for state_dict)."""

    layout: Any
    leaves: list[Any]
    samples: int
    ids: torch.Tensor
    indexed: bool
    position: tuple[int, int]


class _Fetched(NamedTuple):
    """A batch taken: its samples' identities, where the consumer then
    stands, and the batch, or its transform under way."""

    ids: torch.Tensor
    position: tuple[int, int]
    batch: Any
    pending: "Pending | None"


class Pending:
    """One batch being transformed: `result()` waits for it."""

    def __init__(self, work: "Transform", layout: Any, leaves: list[Any], ids: torch.Tensor,
                 indexed: bool, epoch: int) -> None:
        self.work = work
        self.leaves = leaves  # kept until the batch is handed out (GPU: see result)
        self.ids = ids
        self.indexed = indexed
        self.epoch = epoch
        self.samples = int(ids.numel())
        self.out = _Collated(self.samples)
        self.errors: dict[int, BaseException] = {}
        streams = work.streams
        self.cuda = streams.gpu_of(leaves)
        self.stream: Any = None
        self.tasks: list[futures.Future[None]] = []
        identities = ids.tolist()
        self.identities = identities
        if self.cuda is not None:
            self.stream = streams.side(self.cuda)
            # The samples are ready on the stream that took the batch: made
            # where it was taken (Transform._fetch), this thread's current one.
            streams.follow(self.stream, self.cuda)
        if work.pool is None:
            self._run(layout, 0, self.samples)
        else:
            chunks = min(work.threads, max(1, self.samples))
            bounds = [self.samples * c // chunks for c in range(chunks + 1)]
            for a, b in zip(bounds, bounds[1:]):
                if b > a:
                    self.tasks.append(work.pool.submit(self._run, layout, a, b))

    def name(self, i: int) -> str:
        identity = self.identities[i]
        what = f"sample {identity} (its dataset index)" if self.indexed else \
            f"the sample at position {identity} of the producer's epoch"
        return what

    def _run(self, layout: Any, a: int, b: int) -> None:
        with self.work.streams.on(self.stream):  # the transform's work: on the side stream
            self._samples(layout, a, b)

    def _samples(self, layout: Any, a: int, b: int) -> None:
        work = self.work
        for i in range(a, b):
            if _exiting:
                self.errors[i] = RuntimeError("the interpreter is exiting")
                return
            try:
                with _forks.section:  # a fork of this process waits for the sample (_forks)
                    sample = sample_of(layout, self.leaves, i)
                    seed = sample_seed(work.seed, self.epoch, self.identities[i])
                    if work.with_generator:
                        generator = torch.Generator()
                        generator.manual_seed(seed)
                        result = work.fn(sample, generator=generator)
                    else:
                        with _GLOBAL_GENERATOR, _global_generators_seeded(seed, self.cuda):
                            result = work.fn(sample)
                    self.out.place(i, result, self.name)
            except Exception as exc:  # reaches the training loop with the sample named
                self.errors[i] = exc
                return  # the rest of this chunk is not needed: the batch fails

    def result(self) -> Any:
        """The transformed batch; raises TransformError for the first sample
        (in the batch's order) whose transform raised."""
        for task in self.tasks:
            task.result()
        if self.errors:
            i = min(self.errors)
            exc = self.errors[i]
            raise TransformError(
                f"consumer '{self.work.name}': its transform raised on {self.name(i)} in epoch {self.epoch}: "
                f"{type(exc).__name__}: {exc}", self.identities[i], self.epoch) from exc
        batch = self.out.batch() if self.samples > 0 else None
        if self.stream is not None:
            # The asking stream waits for the side stream's work (an event
            # recorded on the side stream, every chunk's work queued by now);
            # the ring's samples go back only after that wait (their release
            # is recorded on the asking stream).
            self.work.streams.hand_over(self.stream, self.cuda,
                                        [t for t in self.out.tensors if t is not None])
        self.leaves = []
        return batch

    def cancel(self) -> None:
        for task in self.tasks:
            task.cancel()


class Transform:
    """A consumer's transform: the function, its seed, its threads (a pool
    for the samples, and with it a fetch thread that takes and transforms the
    next batch while the training loop uses this one) and its side streams.

    The consumer calls `epoch` (the epoch's batches, transformed, with their
    identities), `drop_ahead` (the epoch was left, or the consumer restarts),
    `close`; `handed` is where the consumer stands while a batch is ahead."""

    def __init__(self, fn: Callable[..., Any], seed: int, threads: int, name: str) -> None:
        self.fn = fn
        self.seed = seed
        self.name = name
        self.with_generator = takes_generator(fn)
        self.threads = threads if self.with_generator else 0
        self.pool: futures.ThreadPoolExecutor | None = None
        self._fetcher: futures.ThreadPoolExecutor | None = None
        if self.threads > 0:
            self.pool = futures.ThreadPoolExecutor(self.threads, thread_name_prefix=f"batchcast-transform-{name}")
            self._fetcher = futures.ThreadPoolExecutor(1, thread_name_prefix=f"batchcast-fetch-{name}")
        self.streams = SideStreams()
        # One batch fetched and transformed ahead of the training loop, and
        # where the consumer stands without it (the batch it handed out).
        self._ahead: futures.Future[_Fetched | None] | None = None
        self.handed: tuple[int, int] | None = None

    def epoch(self, take: Callable[[], Taken | None], number: int) -> Iterator[tuple[Any, torch.Tensor]]:
        """The batches `take` gives, transformed, with their identities:
        `number` is the consumer's count of the epoch (the seeds use it). With
        threads, from the second batch on the next batch is fetched and
        transformed while the training loop uses this one (not after the
        first: a peek, next(iter(loader)), gives that one back)."""
        taken = 0
        while True:
            ahead, self._ahead = self._ahead, None
            got = self._fetch(take, number) if ahead is None else ahead.result()
            if got is None:
                self.handed = None
                return
            taken += 1
            self.handed = None
            # (its samples in the ring are let go before the next is taken)
            batch = got.batch if got.pending is None else got.pending.result()
            if self._fetcher is not None and taken >= 2:
                self.handed = got.position  # where the consumer stands with this batch
                self._ahead = self._fetcher.submit(self._fetch, take, number, True)
            yield batch, got.ids

    def _fetch(self, take: Callable[[], Taken | None], number: int, ahead: bool = False) -> _Fetched | None:
        """The next batch, its transform started (`ahead`: in the fetch
        thread, while the training loop uses the batch before). The fetch
        thread takes GPU batches on the side stream, which then holds their
        ring slots until it is past them (the training loop's own fetches take
        them on its current stream); the transform starts on the same stream,
        so the side stream waits for the stream that took the batch, never
        for the training loop's work when the batch was taken ahead."""
        with self.streams.on(self.streams.in_use() if ahead else None):
            got = take()
            if got is None:
                return None
            if got.samples == 0:
                return _Fetched(got.ids, got.position, unflatten(got.layout, got.leaves), None)
            pending = Pending(self, tree_of(got.layout), got.leaves, got.ids, got.indexed, number)
            return _Fetched(got.ids, got.position, None, pending)

    def drop_ahead(self) -> None:
        """Discards a batch fetched ahead (the epoch was left, or the
        consumer restarts or closes)."""
        ahead, self._ahead = self._ahead, None
        self.handed = None
        if ahead is None:
            return
        try:
            got = ahead.result()
        except BaseException:  # the epoch was left: what it would have raised is moot
            return
        if got is not None and got.pending is not None:
            got.pending.cancel()
            try:
                got.pending.result()
            except Exception:
                pass

    def close(self) -> None:
        """Drops what is ahead, then ends the fetch thread and the sample
        threads (waiting for what they are doing)."""
        try:
            self.drop_ahead()
        finally:
            if self._fetcher is not None:
                self._fetcher.shutdown(wait=True)
                self._fetcher = None
            if self.pool is not None:
                self.pool.shutdown(wait=True, cancel_futures=True)
                self.pool = None

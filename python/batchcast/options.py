"""The Consumer's option objects: what belongs together, made and checked in
one place, so that a mistake is an error where the option is written.

    bc.Consumer("imagenet", 96,
                transform=bc.Augment(augment, seed=7, threads=4),
                group=bc.Group("trial-3", rank, world_size),
                join=bc.Join("catch_up"))

Each argument also takes its plain form where that is the natural one:
``transform=fn``, ``pad={"input_ids": 0}``, ``group="trial-3"`` (rank and
world size from ``torch.distributed``), ``join="next_epoch"``,
``device="cuda:0"``. No torch here: the objects are cheap to make.

Each object also says what it means to the core, as the keywords of the
core's consumer options (``_core()``): an option of one of them is added
here, in the core's options list (``consumer.h``) and where the core uses it.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any, Callable, Mapping

JOIN_WHEN = ("now", "next_epoch", "catch_up")
PAST_LAST_EPOCH = ("raise", "empty")
RELEASE_AFTER = ("stream", "device")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class Augment:
    """A trainer's own augmentation of the shared samples: ``fn`` is called
    once per sample, with that sample, and its results collated as a
    DataLoader's default collate would.

    Its randomness is per sample and reproducible: given a parameter named
    ``generator``, ``fn`` gets a ``torch.Generator`` seeded from ``seed``, the
    consumer's epoch and the sample's identity, and runs on ``threads``
    threads (default: up to 4) one batch ahead of the training loop. A
    function without ``generator`` (drawing from torch's global generator, as
    torchvision's transforms do) is seeded the same way per sample but runs
    one sample at a time in the training thread. ``seed`` defaults to one
    drawn from torch's global generator (``torch.manual_seed`` makes it
    reproducible). ``transform=fn`` is ``transform=bc.Augment(fn)``."""

    fn: Callable[..., Any]
    seed: int | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.fn, Augment) or not callable(self.fn):
            raise TypeError(f"Augment takes a function of one sample, not {type(self.fn).__name__}")
        if self.seed is not None and not _is_int(self.seed):
            raise TypeError(f"Augment's seed must be an int, not {self.seed!r}")
        if self.threads is not None and (not _is_int(self.threads) or self.threads < 0):
            raise ValueError(
                f"Augment's threads must be an int >= 0 (0: in the training thread), not {self.threads!r}")
        if self.threads and not takes_generator(self.fn):
            from ._report import BatchcastWarning

            warnings.warn(
                f"Augment(threads={self.threads}) is not used: the function has no parameter named "
                "`generator`, so it draws from torch's global generator, which is one per process; it runs "
                "one sample at a time in the training thread. Give it a `generator` parameter and draw from "
                "that to run it on threads", BatchcastWarning, stacklevel=3)

    @staticmethod
    def of(value: Any) -> Augment | None:
        """`transform=` as given: an Augment, a function, or None."""
        if value is None or isinstance(value, Augment):
            return value
        if not callable(value):
            raise TypeError(f"transform must be a function of one sample or a batchcast.Augment, "
                            f"not {type(value).__name__}")
        return Augment(value)


def takes_generator(fn: Callable[..., Any]) -> bool:
    """Whether `fn` has a parameter named `generator` (keyword or
    positional): its randomness then comes from the generator batchcast
    hands it."""
    import inspect

    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    p = parameters.get("generator")
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


@dataclasses.dataclass(frozen=True)
class Pad:
    """Re-padding of samples of variable length (speech, text, clips): where
    one batch of the consumer joins loader batches that the loader padded to
    different lengths, each leaf named in ``values`` is padded on the trailing
    side of each dimension its samples differ in to the largest among them,
    with that leaf's value, rounded up to a multiple of ``multiple_of``.

    ``values``: one number for every leaf, or a dict from a leaf's key to its
    pad value (``{"input_ids": 0, "attention_mask": 0, "labels": -100}``); a
    tuple of keys names a leaf deeper inside (``("inputs", "ids")``), a
    position in a tuple batch is its int. ``pad=values`` is
    ``pad=bc.Pad(values)``."""

    values: float | Mapping[Any, float]
    multiple_of: int = 1
    # What the core takes: (the keys leading to the leaf, as text, its value),
    # and the value for every leaf (a number given for all).
    leaves: tuple[tuple[tuple[str, ...], float], ...] = dataclasses.field(init=False, repr=False)
    every: float | None = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not _is_int(self.multiple_of) or self.multiple_of < 1:
            raise ValueError(f"Pad's multiple_of must be a positive int, not {self.multiple_of!r}")
        if not isinstance(self.values, Mapping):
            object.__setattr__(self, "leaves", ())
            object.__setattr__(self, "every", _pad_value(self.values, "pad"))
            return
        leaves = []
        for key, value in self.values.items():
            keys = key if isinstance(key, tuple) else (key,)
            if not keys or any(isinstance(k, bool) or not isinstance(k, (str, int)) for k in keys):
                raise TypeError(
                    f"pad's keys name leaves of the batch: a key of its dict (or a position in its tuple), "
                    f"or a tuple of those for a leaf deeper inside, not {key!r}")
            leaves.append((tuple(str(k) for k in keys), _pad_value(value, f"pad[{key!r}]")))
        if not leaves:
            raise ValueError("pad={} declares no leaf: name the leaves to pad, or pass one value for all")
        object.__setattr__(self, "leaves", tuple(leaves))
        object.__setattr__(self, "every", None)

    def _core(self) -> dict[str, Any]:
        """The core consumer's keywords for this padding."""
        return {"pad_leaves": [(list(keys), value) for keys, value in self.leaves],
                "pad_every": self.every, "pad_multiple_of": self.multiple_of}

    @staticmethod
    def of(value: Any) -> Pad | None:
        """`pad=` as given: a Pad, a number, a dict, or None."""
        if value is None or isinstance(value, Pad):
            return value
        return Pad(value)


def _pad_value(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number (the value padded positions get), not {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class Group:
    """This consumer is one rank of a data-parallel trial (a DDP job): of
    each ``world_size * batch_size`` consecutive samples of the stream, rank
    r takes the r-th ``batch_size``, so the ranks together see each epoch once
    while whole-stream consumers beside them see all of it. ``rank`` and
    ``world_size`` default to ``torch.distributed``'s when it is initialized
    (``group="trial-3"`` is ``group=bc.Group("trial-3")``)."""

    name: str
    rank: int | None = None
    world_size: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a group's name must be a non-empty str, not {self.name!r}")
        for label, value in (("rank", self.rank), ("world_size", self.world_size)):
            if value is not None and not _is_int(value):
                raise ValueError(f"Group's {label} must be an int, not {value!r}")
        if self.rank is not None and self.world_size is not None and not 0 <= self.rank < self.world_size:
            raise ValueError(f"Group's rank must be in [0, world_size={self.world_size}), not {self.rank}")

    def _core(self) -> dict[str, Any]:
        """The core consumer's keywords for this group (rank and world size known)."""
        return {"group": self.name, "rank": self.rank, "world_size": self.world_size}

    @staticmethod
    def of(value: Any) -> Group | None:
        """`group=` as given, its rank and world size filled in from
        torch.distributed where they were left out."""
        if value is None:
            return None
        group = value if isinstance(value, Group) else Group(value)
        if group.rank is not None and group.world_size is not None:
            return group
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(f"group {group.name!r} needs its rank and world_size "
                             f"(bc.Group({group.name!r}, rank, world_size)), or an initialized "
                             "torch.distributed process group to take them from")
        return Group(group.name,
                     dist.get_rank() if group.rank is None else group.rank,
                     dist.get_world_size() if group.world_size is None else group.world_size)


@dataclasses.dataclass(frozen=True)
class Join:
    """How the consumer joins its producer's stream.

    ``when`` a consumer connects mid-epoch: ``"now"`` (the default) starts
    with the next batch the producer publishes, with epochs of its own, each
    the next ``samples_per_epoch`` samples from where it joined and each
    holding every sample exactly once (where the producer cannot steer its
    loader's order, at the next epoch instead); ``"next_epoch"`` at the
    producer's next epoch; ``"catch_up"`` the current epoch from its start,
    while its first batches are still retained.

    ``past_last_epoch``: an epoch asked for after the producer served all of
    its epochs raises ``batchcast.EpochsExhausted`` (``"raise"``: a training
    loop must not quietly get nothing) or is empty (``"empty"``).

    ``runtime_dir``: where the producer is found (default: the per-user
    directory, or ``BATCHCAST_RUNTIME_DIR``). ``join="catch_up"`` is
    ``join=bc.Join("catch_up")``."""

    when: str = "now"
    past_last_epoch: str = "raise"
    runtime_dir: str | None = None

    def __post_init__(self) -> None:
        if self.when not in JOIN_WHEN:
            raise ValueError(f"join must be one of {', '.join(map(repr, JOIN_WHEN))}, not {self.when!r}")
        if self.past_last_epoch not in PAST_LAST_EPOCH:
            raise ValueError(f"Join's past_last_epoch must be 'raise' or 'empty', not {self.past_last_epoch!r}")
        if self.runtime_dir is not None and not isinstance(self.runtime_dir, str):
            raise TypeError(f"Join's runtime_dir must be a str, not {self.runtime_dir!r}")

    def _core(self) -> dict[str, Any]:
        """The core consumer's keywords for this way of joining."""
        return {"runtime_dir": self.runtime_dir or "", "catch_up": self.when == "catch_up",
                "join_now": self.when == "now", "empty_past_last_epoch": self.past_last_epoch == "empty"}

    @staticmethod
    def of(value: Any) -> Join:
        """`join=` as given: a Join or its `when`."""
        if isinstance(value, Join):
            return value
        if not isinstance(value, str):
            raise TypeError(f"join must be one of {', '.join(map(repr, JOIN_WHEN))} or a batchcast.Join, "
                            f"not {value!r}")
        return Join(value)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where batches arrive, and as what.

    ``device``: by default (None) where the producer put them: host shared
    memory, or the producer's GPU. ``"cuda:K"`` on another GPU costs one
    GPU-to-GPU copy per loader batch; ``"cpu"`` from a GPU producer one
    device-to-host copy.

    ``release_after``: a GPU batch's memory is reused once the stream that
    was current when you took it is past your last use of it (``"stream"``),
    or once the whole GPU is (``"device"``: you also use batches on side
    streams).

    ``writable``: every batch is a private copy you may modify in place
    (else host batches are read-only views of shared memory).

    ``shared_gpu_views``: a GPU producer's batches arrive as zero-copy views
    of its memory, which every consumer on that GPU shares and none may
    modify (else each is a private copy on the GPU).

    ``device="cuda:0"`` is ``device=bc.Placement("cuda:0")``."""

    device: Any = None
    release_after: str = "stream"
    writable: bool = False
    shared_gpu_views: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.device, Placement):
            raise TypeError("Placement takes a device (\"cpu\", \"cuda:0\", a torch.device), not a Placement")
        if self.release_after not in RELEASE_AFTER:
            raise ValueError(f"Placement's release_after must be 'stream' or 'device', not {self.release_after!r}")
        for label in ("writable", "shared_gpu_views"):
            if not isinstance(getattr(self, label), bool):
                raise TypeError(f"Placement's {label} must be a bool, not {getattr(self, label)!r}")
        if self.writable and self.shared_gpu_views:
            raise ValueError("Placement: writable=True makes every batch a private copy; shared_gpu_views=True "
                             "hands out views every consumer shares: choose one")

    def _core(self) -> dict[str, Any]:
        """The core consumer's keywords for this placement (the device parsed here: torch is loaded)."""
        from ._core import _C
        from ._device import parse_device

        where, cuda_device = _C.Placement.AUTO, -1
        if self.device is not None:
            kind, cuda_device = parse_device(self.device, "device")
            where = _C.Placement.HOST if kind == "cpu" else _C.Placement.CUDA
        release_after = _C.ReleaseAfter.STREAM if self.release_after == "stream" else _C.ReleaseAfter.DEVICE
        return {"placement": where, "cuda_device": cuda_device, "release_after": release_after,
                "writable": self.writable, "shared_gpu_views": self.shared_gpu_views}

    @staticmethod
    def of(value: Any) -> Placement:
        """`device=` as given: a Placement, a device, or None."""
        return value if isinstance(value, Placement) else Placement(value)


CACHE_WHERE = ("memory", "disk")


@dataclasses.dataclass(frozen=True)
class Cache:
    """A producer's decoded cache (``Producer(loader, name, cache=...)``):
    the loader's first epoch is served as ever and each sample it decodes is
    kept, by its dataset index; every later epoch (and, on disk, the next
    sweep's) is assembled from the kept samples in the order the loader's
    sampler gives, without running the loader. Only for a loader whose
    samples are the same every epoch: random augmentation belongs in the
    consumers' ``transform=`` (each epoch the producer re-decodes ``check``
    samples and compares: a difference turns the cache off, with a WARNING
    naming the leaf).

    ``where``: ``"memory"`` (the producer's memory, at most ``max_bytes``;
    default half the memory available when it is made) or ``"disk"`` (a file
    in ``directory``, default ``$XDG_CACHE_HOME/batchcast`` or
    ``~/.cache/batchcast``, mapped: the page cache keeps it in memory, and
    the next producer of that name over the same data starts from it).
    ``key``: anything else that tells your data apart (a version of the
    decoding, say); the dataset's type and length and the samples' shapes
    and dtypes are checked anyway. ``cache="memory"`` is
    ``cache=bc.Cache("memory")``."""

    where: str = "memory"
    directory: str | None = None
    key: str = ""
    max_bytes: int | None = None
    check: int = 4

    def __post_init__(self) -> None:
        if self.where not in CACHE_WHERE:
            raise ValueError(f"Cache's where must be 'memory' or 'disk', not {self.where!r}")
        if self.directory is not None and not isinstance(self.directory, (str, os.PathLike)):
            raise TypeError(f"Cache's directory must be a path, not {self.directory!r}")
        if self.directory is not None and self.where != "disk":
            raise ValueError("Cache: directory= is where a disk cache lives; pass where=\"disk\" with it")
        if not isinstance(self.key, str):
            raise TypeError(f"Cache's key must be a str, not {self.key!r}")
        if self.max_bytes is not None and (not _is_int(self.max_bytes) or self.max_bytes <= 0):
            raise ValueError(f"Cache's max_bytes must be None or an int > 0, not {self.max_bytes!r}")
        if not _is_int(self.check) or self.check < 0:
            raise ValueError(f"Cache's check must be an int >= 0 (samples re-decoded per epoch), not {self.check!r}")

    @staticmethod
    def of(value: Any) -> Cache | None:
        """`cache=` as given: None, "memory", "disk" or a Cache."""
        if value is None or isinstance(value, Cache):
            return value
        if isinstance(value, str) and value in CACHE_WHERE:
            return Cache(value)
        raise TypeError(f"cache must be None, 'memory', 'disk' or a batchcast.Cache, not {value!r}")

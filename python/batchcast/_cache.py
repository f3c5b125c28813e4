"""The producer's decoded cache: decode once per sweep, not once per epoch.

The first epoch runs the loader as ever; each batch it yields is kept, row
by row, by its samples' dataset indices (the producer knows them: see
_identity). From then on an epoch takes its order from the loader's batch
sampler, exactly as the loader would (the same generator, the join plan's
block order, the same batches), and each batch is gathered from the kept
rows straight into a leased ring slot: one ``index_select`` per tensor leaf,
no loader, no workers, no Python per sample (per-sample lists, such as file
names, are picked item by item). Consumers see the same stream as without
the cache, so every guarantee on their side holds unchanged.

Only the user can say that their loader's samples are the same every epoch;
each cached epoch begins by re-making a few samples through the dataset and
the collate function and comparing them with the kept rows. A difference (a
random augmentation left in the producer, a stale file) turns the cache off
with a WARNING naming the leaf: the producer serves from the loader again.

Where it lives: ``memory`` (the producer's own memory, bounded) or ``disk``
(one file per producer name, mapped; a complete file is where the next
producer of that name starts, when it was made for the same data). The
file: 8 bytes of magic, a little-endian u32 header length and the header's
CRC-32, the header (JSON: the key, each leaf's dtype, row shape and offset,
the layout, where the per-sample lists and the checksums are), then the
rows of each tensor leaf, the bitmap of samples kept, the lists (JSON), and
a CRC-32 of every 64 KiB block of those. It is written under a temporary
name and renamed once complete.

A file is checked, not trusted: a producer that starts from one verifies
every block first (zlib's CRC-32, about 1 GB/s here: 0.2 s for 192 MiB). A
block that does not match is a WARNING naming the file and the samples
whose rows it holds; those samples are decoded again through the dataset,
written back with the block's new checksum, and only then served. Damage
outside the rows (the bitmap, the lists, the header) makes the file again
from the loader. A file made for data that has changed since (its samples
re-made at an epoch's start differ from the kept ones) is made again from
that epoch, not turned off.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import random
import shutil
import struct
import zlib
from typing import TYPE_CHECKING, Any, Callable, Sequence, cast

import torch

from ._identity import why_unknown
from ._structure import flatten_after, leaf_paths, tree_of
from .options import Cache

if TYPE_CHECKING:
    from ._C import _Leaf as Leaf

_log = logging.getLogger("batchcast")

MAGIC = b"BCCACHE2"
FORMAT = 2
_ALIGN = 4096
BLOCK = 1 << 16  # bytes per checksum


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _block_sums(data: memoryview, start: int, end: int) -> list[int]:
    """The CRC-32 of each BLOCK of data[start:end] (the last one shorter)."""
    return [zlib.crc32(data[at:min(at + BLOCK, end)]) for at in range(start, end, BLOCK)]


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def _memory_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def default_directory() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "batchcast")


def why_not_cached(loader: Any) -> str | None:
    """None when the producer can keep `loader`'s samples by dataset index
    and make its epochs from them, else why it cannot: it must know each
    batch's dataset indices (_identity), and the dataset's length."""
    why = why_unknown(loader)
    if why is not None:
        return why
    try:
        len(loader.dataset)
    except TypeError:
        return "its DataLoader's dataset has no len(): the cache is sized by it"
    return None


def _remove_abandoned(path: str) -> None:
    """Removes files a producer of this name began and never finished (it
    was killed in its first epoch): `path`.partial-PID of a PID not running."""
    directory, base = os.path.split(path)
    for entry in os.listdir(directory):
        if not entry.startswith(base + ".partial-"):
            continue
        try:
            pid = int(entry.rsplit("-", 1)[1])
            os.kill(pid, 0)
            continue  # (a producer of this name still making it)
        except ProcessLookupError:
            pass
        except (ValueError, PermissionError):
            continue
        try:
            os.unlink(os.path.join(directory, entry))
        except OSError:
            pass


class _Kept:
    """What is kept of one leaf: a tensor of rows (dim 0: dataset index), or
    the items of a per-sample list."""

    def __init__(self, path: str, rows: torch.Tensor | None = None, kind: Any = None,
                 items: list[str | None] | None = None) -> None:
        self.path = path
        self.rows = rows
        self.kind = kind
        self.items = items


class DecodedCache:
    """One producer's cache of its loader's decoded samples (see the module)."""

    def __init__(self, option: Cache, name: str, loader: Any, remake: Callable[[list[int]], Any]) -> None:
        self.option = option
        self.name = name
        self.size = len(loader.dataset)  # (why_not_cached: it has one)
        self._remake = remake  # dataset indices -> a batch, as the loader would make it
        self.key = {"dataset": f"{type(loader.dataset).__module__}.{type(loader.dataset).__qualname__}",
                    "samples": self.size, "key": option.key}
        self.state = "building"  # "ready" once an epoch was kept; "off" (why_off says why)
        self.why_off = ""
        self.layout = ""
        self.tree: list[Any] | None = None
        self.kept: list[_Kept] = []
        self.recorded = torch.zeros(self.size, dtype=torch.bool)
        self.bytes = 0
        self.batches_served = 0  # batches gathered from the cache
        self.batches_remade = 0  # ... made in the producer (samples not kept yet)
        self.warm = False  # started from a file a producer before it made
        self._file: torch.Tensor | None = None  # the disk cache's mapping
        self._partial: str | None = None  # ... while it is being made: its file
        self._said_warm = False  # a warm start is said as its first epoch begins (a serve's log is set up by then)
        self._specs: list[dict[str, Any]] = []  # the disk file's leaves, as its header lists them
        self._bitmap_at = 0  # ... and where its bitmap of the samples kept begins
        self.path = ""
        if option.where == "disk":
            directory = os.fspath(option.directory) if option.directory is not None else default_directory()
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
            self.path = os.path.join(directory, f"{safe}.batchcast-cache")
            self._open_file()

    # ---- the first epoch: keeping what the loader makes ---------------------
    def record(self, leaves: Sequence[Leaf], layout: str, samples: int, indices: list[int] | None) -> None:
        """Keeps a loader batch's rows by the dataset indices of its samples."""
        if self.state == "off":
            return
        if indices is None:
            self.off("the producer does not know the dataset indices of its loader's batches (its "
                     "collate_fn adds or drops samples, or its sampler yields keys, not integers)")
            return
        if not self.kept:
            if not self._allocate(leaves, layout):
                return
        elif layout != self.layout:
            self.off("its loader's batches differ in structure, or in values that are the whole batch's "
                     f"(this batch: {layout[:200]}; the first: {self.layout[:200]}): a batch made from kept "
                     "samples could not be the loader's")
            return
        if not self._check_shapes(leaves):
            return
        at = torch.tensor(indices, dtype=torch.long)
        for kept, leaf in zip(self.kept, leaves):
            if kept.rows is not None:
                kept.rows.index_copy_(0, at, cast(torch.Tensor, leaf))
            else:
                items = leaf[1]
                for i, item in zip(indices, items):
                    kept.items[i] = item  # type: ignore[index]
        self.recorded[at] = True

    def epoch_ended(self) -> None:
        """The loader's epoch ended: what it kept serves from now on."""
        if self.state != "building" or not self.kept:
            if self.state == "building":
                self.off("its loader yielded no batch to keep")
            return
        if self.option.where == "disk":
            try:
                self._finish_file()
            except OSError as exc:
                self.off(f"its file could not be written ({exc})")
                return
        self.state = "ready"
        _log.info("producer '%s': %d samples decoded once are kept (%s, %s); later epochs are made from them",
                  self.name, int(self.recorded.sum()), _gib(self.bytes), self._where())

    # ---- later epochs: serving from it --------------------------------------
    def serves(self, epoch: int) -> bool:
        """Whether epoch `epoch` is made from the cache: it is ready, and the
        samples re-made now are the ones kept."""
        if self.state != "ready":
            return False
        if not self._same_as_kept(epoch):
            return False
        if self.warm and not self._said_warm:
            self._said_warm = True
            _log.info("producer '%s': %d decoded samples from %s (%s): every epoch is made from them",
                      self.name, int(self.recorded.sum()), self.path, _gib(self.bytes))
        return True

    @staticmethod
    def same_draws_as_an_epoch_of(loader: Any) -> None:
        """Draws what a DataLoader's iterator draws as it is made (its workers'
        base seed, from the loader's generator, or torch's global one), so
        that its sampler's order of this epoch and every later one is the one
        the loader itself would give. A loader with persistent workers makes
        its iterator once (in the epoch the loader ran)."""
        if loader.persistent_workers and loader.num_workers > 0:
            return
        torch.empty((), dtype=torch.int64).random_(generator=loader.generator)

    def batch(self, indices: list[int], place: Callable[[int, torch.Size, torch.dtype], torch.Tensor | None]
              ) -> tuple[list[Leaf], str, int, bool] | None:
        """The batch of these samples, gathered from the kept rows — each
        tensor leaf into ``place(leaf, shape, dtype)`` where it gives a place
        (a leased ring slot), else into a tensor of its own — or None where
        some of them were never kept (the loader's sampler left them out of
        the first epoch). Returns (leaves, layout, samples, all placed)."""
        at = torch.tensor(indices, dtype=torch.long)
        if not bool(self.recorded[at].all()):
            return None
        # Every tensor leaf placed, or none (a slot is written whole or not at all).
        outs = {k: place(k, torch.Size((len(indices), *kept.rows.shape[1:])), kept.rows.dtype)
                for k, kept in enumerate(self.kept) if kept.rows is not None}
        placed = bool(outs) and all(out is not None for out in outs.values())
        leaves: list[Leaf] = []
        for k, kept in enumerate(self.kept):
            if kept.rows is not None:
                out = outs[k] if placed else None
                if out is None:
                    leaves.append(kept.rows.index_select(0, at))
                else:
                    torch.index_select(kept.rows, 0, at, out=out)
                    leaves.append(out)
            else:
                items = kept.items
                leaves.append((kept.kind, [cast(str, items[i]) for i in indices]))  # type: ignore[index]
        self.batches_served += 1
        return leaves, self.layout, len(indices), placed

    def remade(self, indices: list[int], tree: list[Any] | None) -> tuple[list[Leaf], str, int, list[Any]]:
        """A batch of samples never kept, made in the producer as the loader
        would (and kept now)."""
        leaves, layout, samples, tree = flatten_after(self._remake(indices), tree)
        self.record(leaves, layout, samples, indices)  # (a file keeps them only for this producer)
        self.batches_remade += 1
        return leaves, layout, samples, tree

    def stats(self) -> dict[str, Any]:
        return {"cache": self.state, "cache_where": self.option.where, "cache_path": self.path,
                "cache_bytes": self.bytes, "cache_samples": int(self.recorded.sum()),
                "cache_batches": self.batches_served, "cache_batches_remade": self.batches_remade,
                "cache_warm": self.warm, "cache_off_because": self.why_off}

    def off(self, why: str) -> None:
        """Turns the cache off for good: the producer serves from its loader."""
        if self.state == "off":
            return
        self.state = "off"
        self.why_off = why
        self.kept = []
        self._file = None
        self._remove_partial()
        _log.warning("producer '%s': its decoded cache is off, because %s; it serves every epoch from its "
                     "loader", self.name, why)

    def _again(self, why: str) -> None:
        """A file an earlier producer made no longer matches the data: makes
        the cache again from this epoch's loader batches (then checked as
        any cache is, so data that changes every epoch turns it off)."""
        _log.warning("producer '%s': its decoded cache file is not used, because %s; this epoch is served "
                     "from the loader and kept, and its file made again", self.name, why)
        self.state = "building"
        self.kept = []
        self._file = None
        self.recorded = torch.zeros(self.size, dtype=torch.bool)
        self.bytes = 0
        self.warm = False
        self.layout = ""
        self.tree = None

    def close(self) -> None:
        """Lets go of what it keeps; a file never finished (its first epoch
        did not end) goes."""
        self.kept = []
        self._file = None
        self._remove_partial()

    def _remove_partial(self) -> None:
        partial = self._partial
        if partial is not None:
            self._partial = None
            try:
                os.unlink(partial)
            except OSError:
                pass

    # ---- inside ---------------------------------------------------------------
    def _where(self) -> str:
        return f"in {self.path}" if self.option.where == "disk" else "in memory"

    def _allocate(self, leaves: Sequence[Leaf], layout: str) -> bool:
        self.layout = layout
        self.tree = tree_of(layout)
        paths = leaf_paths(self.tree)
        rows: list[tuple[str, torch.dtype, tuple[int, ...]] | None] = []
        total = 0
        for path, leaf in zip(paths, leaves):
            if isinstance(leaf, torch.Tensor):
                if leaf.device.type != "cpu":
                    self.off(f"{path} is on {leaf.device}: the cache keeps what the loader makes on the CPU")
                    return False
                row = tuple(leaf.shape[1:])
                rows.append((path, leaf.dtype, row))
                total += _align(self.size * leaf[:1].numel() * leaf.element_size() if leaf.shape[0] else 0)
            else:
                rows.append(None)
        total += _align(self.size)  # the bitmap
        if self.option.where == "memory":
            limit = self.option.max_bytes or _memory_available() // 2
            if total > limit:
                self.off(f"its {self.size} samples take {_gib(total)}, more than "
                         + (f"max_bytes ({_gib(limit)})" if self.option.max_bytes else
                            f"half the memory available ({_gib(limit)}); pass bc.Cache(max_bytes=...) to "
                            "allow more")
                         + "; cache='disk' keeps them in a file instead")
                return False
            kept = []
            for path, spec in zip(paths, rows):
                if spec is None:
                    kept.append(_Kept(path, items=[None] * self.size))
                else:
                    kept.append(_Kept(path, rows=torch.empty((self.size, *spec[2]), dtype=spec[1])))
        else:
            made = self._create_file(paths, rows, leaves, total)
            if made is None:
                return False
            kept = made
        for k, leaf in zip(kept, leaves):
            if k.rows is None:
                k.kind = leaf[0]
        self.kept = kept
        self.bytes = total
        return True

    def _check_shapes(self, leaves: Sequence[Leaf]) -> bool:
        for kept, leaf in zip(self.kept, leaves):
            if kept.rows is None:
                if isinstance(leaf, torch.Tensor) or leaf[0] != kept.kind:
                    self.off(f"{kept.path} changed kind between batches")
                    return False
                continue
            if not isinstance(leaf, torch.Tensor) or leaf.dtype != kept.rows.dtype \
                    or tuple(leaf.shape[1:]) != tuple(kept.rows.shape[1:]):
                got = (f"{tuple(leaf.shape[1:])} {leaf.dtype}" if isinstance(leaf, torch.Tensor)
                       else "a list")
                self.off(f"{kept.path} has samples of {got} in one batch and "
                         f"{tuple(kept.rows.shape[1:])} {kept.rows.dtype} in another (padded to each "
                         "batch's longest?): the cache keeps leaves whose samples all have one shape")
                return False
        return True

    def _same_as_kept(self, epoch: int) -> bool:
        """Re-makes `check` kept samples and compares them with the kept rows."""
        count = min(self.option.check, int(self.recorded.sum()))
        if count == 0:
            return True
        kept_indices = torch.nonzero(self.recorded).flatten().tolist()
        chosen = sorted(random.Random(epoch * 1_000_003 + self.size).sample(kept_indices, count))
        try:
            leaves, layout, _, _ = flatten_after(self._remake(chosen), self.tree)
        except Exception as exc:  # the dataset failed now: the loader will say so too
            self.off(f"re-making samples {chosen} to check it raised {type(exc).__name__}: {exc}")
            return False
        if layout != self.layout:
            self.off(f"samples {chosen} re-made now have another structure than the ones kept")
            return False
        cached = self.batch(chosen, lambda k, shape, dtype: None)
        self.batches_served -= 1  # (a check, not a batch served)
        assert cached is not None
        for kept, now, then in zip(self.kept, leaves, cached[0]):
            if isinstance(now, torch.Tensor) and isinstance(then, torch.Tensor):
                same = now.shape == then.shape and now.dtype == then.dtype and torch.equal(
                    now.contiguous().view(torch.uint8), then.contiguous().view(torch.uint8))
            else:
                same = now == then
            if not same and self.warm:
                self._again(f"samples {chosen} re-made for epoch {epoch} differ from the ones its file "
                            f"{self.path} keeps at {kept.path} (made by an earlier producer: the data "
                            "changed since?)")
                return False
            if not same:
                self.off(f"samples {chosen} re-made for epoch {epoch} differ from the ones kept at "
                         f"{kept.path}: its loader's samples change from epoch to epoch (a random "
                         "augmentation in the producer's dataset?), and a cache would freeze its first "
                         "epoch's draws. Move the random part into the consumers' transform= "
                         "(bc.Augment), or leave cache= unset" +
                         (f"; if the data changed, remove {self.path}" if self.warm else ""))
                return False
        return True

    # ---- the file -------------------------------------------------------------
    def _header_key(self) -> dict[str, Any]:
        return {"format": FORMAT, **self.key}

    def _open_file(self) -> None:
        """Starts from a complete file made for the same data, if there is one."""
        path = self.path
        if not os.path.exists(path):
            return
        try:
            with open(path, "rb") as f:
                head = f.read(16)
                if len(head) == 16 and head[:7] == MAGIC[:7] and head[:8] != MAGIC:
                    _log.info("producer '%s': the cache file %s is of an older format: it is made again",
                              self.name, path)
                    return
                if len(head) < 16 or head[:8] != MAGIC:
                    raise ValueError("it is not a batchcast cache file")
                length, crc = struct.unpack("<II", head[8:])
                if length > _ALIGN - 16:
                    raise ValueError("its header is too long")
                text = f.read(length)
                if zlib.crc32(text) != crc:
                    raise ValueError("its header does not match its checksum (the file is damaged)")
                header = json.loads(text)
            key = {k: header.get(k) for k in self._header_key()}
            if key != self._header_key():
                _log.info("producer '%s': the cache file %s was made for other data (%s; now %s): it is made "
                          "again", self.name, path, key, self._header_key())
                return
            size = os.path.getsize(path)
            if size != header["file_bytes"]:
                raise ValueError(f"it has {size} bytes, not {header['file_bytes']} (truncated?)")
            damaged = self._damaged_blocks(path, header)
            mapping = torch.from_file(path, shared=False, size=size, dtype=torch.uint8)
            kept: list[_Kept] = []
            lists = json.loads(bytes(mapping[header["lists_at"]:header["lists_at"] + header["lists_bytes"]]
                                     .numpy())) if header["lists_bytes"] else []
            for spec in header["leaves"]:
                if spec["kind"] == "tensor":
                    dtype = getattr(torch, spec["dtype"])
                    row = tuple(spec["row"])
                    n = self.size * int(torch.Size(row).numel()) * torch.empty((), dtype=dtype).element_size()
                    rows = mapping[spec["at"]:spec["at"] + n].view(dtype).view(self.size, *row)
                    kept.append(_Kept(spec["path"], rows=rows))
                else:
                    from ._core import _C
                    items = lists[spec["list"]]
                    if len(items) != self.size:
                        raise ValueError(f"its list at {spec['path']} has {len(items)} items")
                    kept.append(_Kept(spec["path"], kind=getattr(_C.ListKind, spec["kind"]), items=items))
            recorded = mapping[header["bitmap_at"]:header["bitmap_at"] + self.size].view(torch.bool).clone()
            if damaged:
                self._repair(path, header, damaged, kept, recorded, mapping)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
            _log.warning("producer '%s': the cache file %s cannot be used (%s): it is made again from the "
                         "loader", self.name, path, exc)
            return
        try:  # the file read ahead into the page cache (a file on a cold disk)
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.posix_fadvise(fd, 0, size, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)
        except (OSError, AttributeError):
            pass
        self._file = mapping
        self.kept = kept
        self.recorded = recorded
        self.layout = header["layout"]
        self.tree = tree_of(self.layout)
        self.bytes = header["lists_at"] - _ALIGN  # (as a memory cache counts: the rows and the bitmap)
        self.state = "ready"
        self.warm = True

    def _damaged_blocks(self, path: str, header: dict[str, Any]) -> list[int]:
        """The blocks of the file whose bytes do not match their checksums."""
        block, sums_at = int(header["block_bytes"]), int(header["sums_at"])
        if block != BLOCK:
            raise ValueError(f"its checksums are of {block}-byte blocks, not {BLOCK}")
        count = (sums_at - _ALIGN + BLOCK - 1) // BLOCK
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m, \
                memoryview(m) as view:
            now = _block_sums(view, _ALIGN, sums_at)
            then = struct.unpack(f"<{count}I", view[sums_at:sums_at + 4 * count])
        return [k for k, (a, b) in enumerate(zip(now, then)) if a != b]

    def _repair(self, path: str, header: dict[str, Any], damaged: list[int], kept: list[_Kept],
                recorded: torch.Tensor, mapping: torch.Tensor) -> None:
        """Decodes again the samples whose rows lie in damaged blocks, puts
        them in place (in `mapping`, then in the file) with the blocks' new
        checksums; raises ValueError where a damaged block holds anything
        else (the bitmap, the lists), which cannot be made again by sample."""
        spans = [(k, _ALIGN + k * BLOCK, min(_ALIGN + (k + 1) * BLOCK, int(header["sums_at"])))
                 for k in damaged]
        samples: set[int] = set()
        for _, lo, hi in spans:
            if hi > header["bitmap_at"]:
                raise ValueError(f"its bytes {lo}-{hi - 1} do not match their checksum, and they hold the "
                                 "bitmap of samples kept or the lists, not rows")
            for spec, leaf in zip(header["leaves"], kept):
                if leaf.rows is None:
                    continue
                at = int(spec["at"])
                row_bytes = leaf.rows[:1].numel() * leaf.rows.element_size()
                end = at + self.size * row_bytes
                if row_bytes and lo < end and hi > at:
                    first = (max(lo, at) - at) // row_bytes
                    last = (min(hi, end) - 1 - at) // row_bytes
                    samples.update(range(first, last + 1))
        redo = sorted(i for i in samples if bool(recorded[i]))
        shown = ", ".join(map(str, redo[:20])) + (f" and {len(redo) - 20} more" if len(redo) > 20 else "")
        _log.warning("producer '%s': the cache file %s is damaged: %d block(s) of %d bytes do not match their "
                     "checksums (bytes %s); the samples whose rows they hold (%d: %s) are decoded again "
                     "and written back, and nothing damaged is served", self.name, path, len(damaged),
                     BLOCK, ", ".join(f"{lo}-{hi - 1}" for _, lo, hi in spans[:8])
                     + (" ..." if len(spans) > 8 else ""), len(redo), shown or "none")
        if redo:
            tree = tree_of(header["layout"])
            leaves, layout, _, _ = flatten_after(self._remake(redo), tree)
            if layout != header["layout"]:
                raise ValueError(f"samples {shown} decoded again have another structure than the ones kept")
            where = torch.tensor(redo, dtype=torch.long)
            for leaf, now in zip(kept, leaves):
                if leaf.rows is not None:
                    if not isinstance(now, torch.Tensor) or now.dtype != leaf.rows.dtype \
                            or tuple(now.shape[1:]) != tuple(leaf.rows.shape[1:]):
                        raise ValueError(f"samples {shown} decoded again differ in shape or dtype at "
                                         f"{leaf.path}")
                    leaf.rows.index_copy_(0, where, now)
        # The repaired blocks, and their checksums, back into the file (the
        # mapping is private: it holds them in memory until then).
        data = mapping.numpy()
        with open(path, "r+b") as f:
            for k, lo, hi in spans:
                block = data[lo:hi].tobytes()
                f.seek(lo)
                f.write(block)
                f.seek(int(header["sums_at"]) + 4 * k)
                f.write(struct.pack("<I", zlib.crc32(block)))
            f.flush()
            os.fsync(f.fileno())

    def _create_file(self, paths: list[str], rows: list[tuple[str, torch.dtype, tuple[int, ...]] | None],
                     leaves: Sequence[Leaf], total: int) -> list[_Kept] | None:
        directory = os.path.dirname(self.path)
        partial = f"{self.path}.partial-{os.getpid()}"
        try:
            os.makedirs(directory, exist_ok=True)
            _remove_abandoned(self.path)
            free = shutil.disk_usage(directory).free
            if total + _ALIGN > free:
                self.off(f"its {self.size} samples take {_gib(total)} and {directory} has {_gib(free)} free")
                return None
            fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                os.posix_fallocate(fd, 0, _ALIGN + total)  # the room, now: a full disk is an error here
            finally:
                os.close(fd)
            mapping = torch.from_file(partial, shared=True, size=_ALIGN + total, dtype=torch.uint8)
        except OSError as exc:
            try:
                os.unlink(partial)
            except OSError:
                pass
            self.off(f"its file {partial} could not be made ({exc})")
            return None
        kept: list[_Kept] = []
        at = _ALIGN
        self._specs = []
        for path, spec in zip(paths, rows):
            if spec is None:
                kept.append(_Kept(path, items=[None] * self.size))
                self._specs.append({"path": path, "kind": None, "list": sum(1 for s in self._specs
                                                                            if s["kind"] != "tensor")})
                continue
            _, dtype, row = spec
            n = self.size * int(torch.Size(row).numel()) * torch.empty((), dtype=dtype).element_size()
            kept.append(_Kept(path, rows=mapping[at:at + n].view(dtype).view(self.size, *row)))
            self._specs.append({"path": path, "kind": "tensor", "dtype": str(dtype).removeprefix("torch."),
                                "row": list(row), "at": at})
            at += _align(n)
        self._bitmap_at = at
        self._file = mapping
        self._partial = partial
        return kept

    def _finish_file(self) -> None:
        """Writes what the file keeps and its header, and gives it its name."""
        assert self._file is not None and self._partial is not None
        partial = self._partial
        lists = []
        for spec, kept in zip(self._specs, self.kept):
            if kept.rows is None:
                spec["kind"] = kept.kind.name
                lists.append(kept.items)
        self._file[self._bitmap_at:self._bitmap_at + self.size].copy_(self.recorded.view(torch.uint8))
        blob = json.dumps(lists).encode() if lists else b""
        lists_at = _ALIGN + self.bytes
        sums_at = lists_at + len(blob)
        with open(partial, "r+b") as f:
            f.seek(lists_at)
            f.write(blob)
            f.truncate(sums_at)
            f.flush()
            with mmap.mmap(f.fileno(), sums_at, prot=mmap.PROT_READ) as m, memoryview(m) as view:
                sums = _block_sums(view, _ALIGN, sums_at)
            f.seek(sums_at)
            f.write(struct.pack(f"<{len(sums)}I", *sums))
            header = {**self._header_key(), "leaves": self._specs, "layout": self.layout,
                      "bitmap_at": self._bitmap_at, "lists_at": lists_at, "lists_bytes": len(blob),
                      "block_bytes": BLOCK, "sums_at": sums_at, "file_bytes": sums_at + 4 * len(sums)}
            head = json.dumps(header).encode()
            if 16 + len(head) > _ALIGN:
                raise OSError("the cache's header does not fit its page")
            f.seek(0)
            f.write(MAGIC + struct.pack("<II", len(head), zlib.crc32(head)) + head)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, self.path)
        self._partial = None
        _log.info("producer '%s': its decoded cache is in %s for the next producer of this name", self.name,
                  self.path)

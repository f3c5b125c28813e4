"""The data every system loads: the same datasets, loader settings and batches.

Every sample is (image tensor, label, index); trainers check the indices they
receive, so what each system delivered is part of the result.

  busy     a synthetic dataset with a set CPU cost per sample: a busy loop on
           the thread's CPU clock (so the cost is the same however loaded the
           machine is), then a float32 image filled from the index;
  jpeg     an ImageNet-like pipeline over JPEG files generated once and cached:
           PIL decode, RandomResizedCrop(224) (torchvision's algorithm, with
           PIL's resize), random horizontal flip, to float, normalize (torch);
           sample i decodes file i % files (the crop and flip are seeded by i,
           so every sample does its own work); torchvision itself is not used
           (it does not load against a CPU build of torch here);
  memory   batches made up front (no loading cost), to measure what receiving
           a batch costs a trainer.
"""

from __future__ import annotations

import io
import math
import os
import random
import time
from pathlib import Path

import torch
from torch.utils.data import (DataLoader, Dataset, RandomSampler, Sampler, SequentialSampler,
                              default_collate)

JPEG_VERSION = 1  # bump when the generator changes: a new cache directory
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


class BusyDataset(Dataset):
    """Sample i costs `cost_ms` of CPU; returns (float32 [shape] filled with i, i % 10, i)."""

    def __init__(self, length: int, cost_ms: float, shape: list[int]):
        self.length, self.cost, self.shape = length, cost_ms / 1e3, tuple(shape)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        end = time.thread_time() + self.cost
        while time.thread_time() < end:
            pass
        return torch.full(self.shape, float(index)), index % 10, index


# ---- ImageNet-like JPEGs ---------------------------------------------------------
def jpeg_dir(cache: Path) -> Path:
    return cache / f"jpeg-v{JPEG_VERSION}"


def jpeg_bytes(index: int, seed: int = 0) -> bytes:
    """A photo-like JPEG (400-640 x 300-500, smooth colour field, shapes, sensor
    noise; about 100 KB at quality 90, like an average ImageNet file)."""
    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed * 1_000_003 + index)
    w, h = int(rng.integers(400, 641)), int(rng.integers(300, 501))
    base = rng.integers(0, 256, (h // 40 + 2, w // 40 + 2, 3), dtype=np.uint8)
    img = Image.fromarray(base).resize((w, h), Image.BICUBIC)
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(8, 20))):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        x1, y1 = x0 + int(rng.integers(10, w // 2)), y0 + int(rng.integers(10, h // 2))
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=colour)
    pixels = np.asarray(img, dtype=np.int16) + rng.normal(0, 14, (h, w, 3)).astype(np.int16)
    out = io.BytesIO()
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


def write_once(folder: Path, count: int, make, log=print) -> Path:
    """Files 000000.jpg ... of make(i) in `folder`, each written once (whole:
    through a temporary name); later runs reuse them."""
    folder.mkdir(parents=True, exist_ok=True)
    missing = [i for i in range(count) if not (folder / f"{i:06d}.jpg").exists()]
    if missing:
        log(f"generating {len(missing)} JPEGs into {folder} (once) ...")
        for i in missing:
            tmp = folder / f".{i:06d}.jpg.{os.getpid()}"
            tmp.write_bytes(make(i))
            tmp.rename(folder / f"{i:06d}.jpg")
    return folder


def ensure_jpegs(cache: Path, count: int, log=print) -> Path:
    """Generates the first `count` files once; later runs reuse them."""
    return write_once(jpeg_dir(cache), count, jpeg_bytes, log)


def random_resized_crop_box(width: int, height: int, rng: random.Random,
                            scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """torchvision.transforms.RandomResizedCrop.get_params, as a (left, top, right, bottom) box."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = rng.randint(0, height - h)
            left = rng.randint(0, width - w)
            return left, top, left + w, top + h
    in_ratio = width / height  # fallback: central crop
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    top, left = (height - h) // 2, (width - w) // 2
    return left, top, left + w, top + h


class JpegDataset(Dataset):
    """decode -> RandomResizedCrop(size) -> horizontal flip (p=0.5) -> float -> normalize.
    Sample i decodes file i % files; the random choices are seeded by the index,
    so every system does the same work."""

    def __init__(self, folder: str, length: int, size: int = 224, seed: int = 0,
                 files: int = 0):
        self.folder, self.length, self.size, self.seed = folder, length, size, seed
        self.files = files or length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        from PIL import Image

        rng = random.Random(self.seed * 1_000_003 + index)
        path = os.path.join(self.folder, f"{index % self.files:06d}.jpg")
        with Image.open(path) as img:
            img = img.convert("RGB")
            box = random_resized_crop_box(img.width, img.height, rng)
            img = img.resize((self.size, self.size), Image.BILINEAR, box=box)
        if rng.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        x = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
        x = x.view(self.size, self.size, 3).permute(2, 0, 1).float().div_(255)
        return (x - MEAN) / STD, index % 1000, index


# ---- what a configuration loads ----------------------------------------------------
def make_dataset(w: dict) -> Dataset:
    if w["kind"] == "busy":
        return BusyDataset(w["samples"], w["cost_ms"], w["shape"])
    if w["kind"] == "jpeg":
        return JpegDataset(w["jpeg_dir"], w["samples"], w.get("size", 224),
                           files=w.get("files", 0))
    raise ValueError(w["kind"])


def make_loader(w: dict, batch_size: int, cpus: list[int] | None = None, gate=None):
    """The loader every system uses for workload `w` (a list of batches for `memory`).
    With `gate`, its first epoch waits for gate() before asking for any sample."""
    if w["kind"] == "memory":
        return memory_batches(w)
    generator = torch.Generator().manual_seed(w.get("seed", 0))

    def init(_worker_id: int) -> None:
        torch.set_num_threads(1)
        if cpus:
            os.sched_setaffinity(0, cpus)

    dataset = make_dataset(w)
    # shuffle=True with this generator is this sampler: the same order
    sampler = (RandomSampler(dataset, generator=generator) if w.get("shuffle", True)
               else SequentialSampler(dataset))
    if gate is not None:
        sampler = GatedSampler(sampler, gate)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, generator=generator,
                      num_workers=w["workers"], worker_init_fn=init, persistent_workers=False)


class GatedSampler(Sampler):
    """A sampler whose first pass waits for the start signal: loading (workers
    starting included) begins when the trainers start, as it does for a
    trainer with its own DataLoader. The loader stays a plain DataLoader."""

    def __init__(self, sampler, wait):
        self.sampler, self.wait = sampler, wait

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        if self.wait is not None:
            self.wait()
            self.wait = None
        yield from self.sampler


def copied(samples):
    """default_collate as a function of the benchmark's own: a producer cannot
    have its loader's workers write into the ring (its one-copy path)."""
    return default_collate(samples)


def memory_batches(w: dict) -> list:
    """`samples // batch` ready batches (images, labels, indices), made once."""
    b, n = w["loader_batch"], w["samples"]
    shape = tuple(w["shape"])
    image = torch.rand((b, *shape), generator=torch.Generator().manual_seed(0))
    return [(image.clone(), torch.arange(k, k + b) % 10, torch.arange(k, k + b))
            for k in range(0, n - n % b, b)]


def sample_bytes(w: dict) -> int:
    shape = w["shape"] if w["kind"] != "jpeg" else [3, w.get("size", 224), w.get("size", 224)]
    return 4 * math.prod(shape) + 16


class Gated:
    """Wraps a loader so that its first batch waits for the start signal: loading
    (workers starting included) begins when the trainers start, as it does for a
    trainer with its own DataLoader."""

    def __init__(self, loader, wait):
        self.loader, self.wait = loader, wait
        # lets batchcast see the epoch size
        self.batch_sampler = getattr(loader, "batch_sampler", None)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        if self.wait is not None:
            self.wait()
            self.wait = None
        yield from self.loader

"""An augmentation sweep: the JPEGs are decoded once, each trial augments them
its own way.

    python examples/augment_sweep.py [--trials 3] [--epochs 2] [--images 512] [--size 96]

The producer (a thread of this script) serves a DataLoader that reads and
decodes JPEG files and resizes them to a fixed size, as uint8: the expensive
part, the same for every trial. Each trial is a process of its own (this
script with --trial) whose Consumer has a `transform`: a random resized
crop, a flip and a colour jitter of the trial's own strength, drawn per
sample from the generator batchcast seeds for it (the trial's seed, its
epoch, the sample's dataset index). Each trial trains a small CNN and
reports its loss, and checks what it received: every image once per epoch
(`loader.with_indices()` names them).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset

import batchcast as bc

STRENGTHS = [0.1, 0.3, 0.5, 0.7, 0.2, 0.4, 0.6, 0.8]
BATCH_SIZES = [32, 48, 40, 64, 24, 56, 36, 60]
CLASSES = 10


# ---- the producer's part: read and decode once ----------------------------------

def write_jpegs(folder: Path, count: int) -> list[Path]:
    """Textured 320x240 JPEGs (quality 90), image i of class i % CLASSES."""
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        coarse = rng.normal(128, 50, (12, 16, 3)).clip(0, 255).astype(np.uint8)
        image = np.asarray(Image.fromarray(coarse).resize((320, 240), Image.BICUBIC), np.float32)
        image[..., (i % CLASSES) % 3] += 14 * (i % CLASSES) - 60  # something to learn
        image += rng.normal(0, 16, image.shape)
        path = folder / f"{i:05d}.jpg"
        Image.fromarray(image.clip(0, 255).astype(np.uint8)).save(path, quality=90)
        paths.append(path)
    return paths


class DecodedImages(Dataset):  # type: ignore[type-arg]
    """Sample i: JPEG i decoded and resized to size x size, uint8 3 x size x size, and its class."""

    def __init__(self, paths: list[Path], size: int) -> None:
        self.paths, self.size = paths, size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.paths[i]) as image:
            image = image.convert("RGB").resize((self.size, self.size), Image.BILINEAR)
            pixels = torch.from_numpy(np.asarray(image).copy())
        return pixels.permute(2, 0, 1).contiguous(), i % CLASSES


# ---- each trial's part: its own augmentation, per sample ------------------------

def make_augment(strength: float, crop: int):
    """The trial's transform: every random number from `generator`."""

    def uniform(low: float, high: float, generator: torch.Generator) -> float:
        return low + (high - low) * float(torch.rand((), generator=generator))

    def augment(sample: tuple[torch.Tensor, torch.Tensor], generator: torch.Generator):
        image, label = sample
        _, height, width = image.shape
        # A random resized crop (scale 0.3-1, ratio 3/4-4/3), to crop x crop.
        area = height * width * uniform(0.3, 1.0, generator)
        ratio = math.exp(uniform(math.log(3 / 4), math.log(4 / 3), generator))
        h = min(height, int(round(math.sqrt(area / ratio))))
        w = min(width, int(round(math.sqrt(area * ratio))))
        top = int(torch.randint(0, height - h + 1, (), generator=generator))
        left = int(torch.randint(0, width - w + 1, (), generator=generator))
        x = image[:, top:top + h, left:left + w].float().unsqueeze(0) / 255
        x = F.interpolate(x, size=(crop, crop), mode="bilinear", align_corners=False)[0]
        if float(torch.rand((), generator=generator)) < 0.5:
            x = x.flip(-1)
        # Brightness and contrast, each by a factor in [1 - s, 1 + s].
        x = x * uniform(1 - strength, 1 + strength, generator)
        mean = x.mean()
        x = ((x - mean) * uniform(1 - strength, 1 + strength, generator) + mean).clamp(0, 1)
        return (x - 0.5) / 0.25, label

    return augment


def trial(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3, stride=2),
        torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = bc.Consumer(
        args.data,
        batch_size=args.batch_size,
        transform=bc.Augment(make_augment(args.strength, args.crop), seed=args.seed, threads=2),
    )
    losses, exactly_once = [], True
    for epoch in range(args.epochs):
        seen: list[int] = []
        total = 0.0
        # was: for images, labels in DataLoader(...); with each sample's dataset index beside
        for (images, labels), indices in loader.with_indices():
            assert images.shape[1:] == (3, args.crop, args.crop) and images.dtype == torch.float32
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(labels)
            seen += indices.tolist()
        exactly_once = exactly_once and sorted(seen) == list(range(args.images))
        losses.append(total / max(1, len(seen)))
    loader.close()
    print(json.dumps({"seed": args.seed, "strength": args.strength, "batch_size": args.batch_size,
                      "losses": losses, "exactly_once": exactly_once}))


# ---- the sweep ------------------------------------------------------------------

def sweep(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="batchcast-augment-") as tmp:
        paths = write_jpegs(Path(tmp), args.images)
        loader = DataLoader(DecodedImages(paths, args.size), batch_size=32, shuffle=True,
                            num_workers=args.workers)
        name = f"augment-{Path(tmp).name[-8:]}"
        trials = []
        with bc.Producer(loader, name, epochs=args.epochs, min_consumers=args.trials):
            for k in range(args.trials):
                command = [sys.executable, __file__, "--trial", "--data", name, "--seed", str(k),
                           "--strength", str(STRENGTHS[k % len(STRENGTHS)]),
                           "--batch-size", str(BATCH_SIZES[k % len(BATCH_SIZES)]),
                           "--epochs", str(args.epochs), "--images", str(args.images),
                           "--crop", str(args.size * 7 // 8)]
                trials.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
            results = []
            for process in trials:
                out, _ = process.communicate(timeout=600)
                if process.returncode != 0:
                    raise SystemExit(f"a trial exited {process.returncode}")
                results.append(json.loads(out.strip().splitlines()[-1]))
    print(f"{'trial':>5} {'strength':>8} {'batch':>5}  loss per epoch{'':12} every image once per epoch")
    for r in results:
        losses = " ".join(f"{x:.3f}" for x in r["losses"])
        print(f"{r['seed']:>5} {r['strength']:>8} {r['batch_size']:>5}  {losses:<26} {r['exactly_once']}")
    if not all(r["exactly_once"] for r in results):
        raise SystemExit("a trial did not receive every image once per epoch")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--size", type=int, default=96, help="the side images are decoded and resized to")
    parser.add_argument("--workers", type=int, default=1, help="the producer's DataLoader workers")
    parser.add_argument("--trial", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--strength", type=float, default=0.4, help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, default=32, help=argparse.SUPPRESS)
    parser.add_argument("--crop", type=int, default=84, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    (trial if args.trial else sweep)(args)


if __name__ == "__main__":
    main()

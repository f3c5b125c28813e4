"""Decode once, augment per trial: the pieces, in torch ops (torchvision is not used:
it does not load against the CPU build of torch here).

  photo_jpeg(index)      a photo-like JPEG of ImageNet's typical size (500x375,
                         quality 90, ~120 KB: smooth fields at several scales,
                         gradients, a few hundred shapes and lines, sensor
                         noise), so that decoding it costs what a real photo's
                         does (~1.5 ms here; a small smooth image understates it)
  ensure_photos(dir, n)  writes the first n once; later runs reuse them
  decode_resize(path)    PIL decode, shorter side to 256 (bilinear), centre crop
                         256x256 -> uint8 tensor 3x256x256: what a shared producer
                         does once per sample
  augment_sample(sample, generator, strength)
                         one trial's augmentation of (uint8 image, *rest):
                         RandomResizedCrop(224) (torchvision's algorithm, scale
                         (0.08, 1), ratio (3/4, 4/3); bilinear through
                         torch.nn.functional.interpolate, antialias=False, on
                         float), horizontal flip (p=0.5), colour jitter
                         (brightness, contrast, saturation, each factor drawn in
                         [1-s, 1+s], applied in a random order, as
                         torchvision's ColorJitter), normalise with ImageNet's
                         mean and std -> (float32 3x224x224, *rest)
  make_augment(strength) def augment(sample, generator): the transform a
                         trial hands to bc.Consumer(..., transform=augment)
  sample_generator(seed, epoch, index)
                         the per-sample generator a DataLoader trial seeds
                         itself, as a batchcast consumer with transform=
                         seeds its own (from seed, epoch and the sample's
                         dataset index): the same trial gets the same
                         augmentation of a sample either way
  DecodedImages          dataset: sample i decodes file i % files ->
                         (uint8 3x256x256, label, index)
  AugmentedImages        dataset: DecodedImages + one trial's augmentation,
                         seeded per sample: what a trial's own DataLoader does

Every random choice is drawn from the `generator` passed in (torch.rand(...,
generator=generator) and the like): the same generator state gives the same
output, whichever process or thread runs it.
"""

from __future__ import annotations

import io
import math
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

PHOTO_VERSION = 1  # bump when photo_jpeg changes: a new cache folder
PHOTO_SIZE = (500, 375)  # ImageNet's most common size (width, height)
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
GRAY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights


# ---- photo-like JPEGs ----------------------------------------------------------------
def photo_jpeg(index: int, seed: int = 0, size: tuple[int, int] = PHOTO_SIZE,
               quality: int = 90) -> bytes:
    """A deterministic photo-like JPEG: smooth colour fields at four scales
    (coarse to 4-pixel texture), a gradient, 400 shapes and lines with hard
    edges, and sensor noise (sigma 24): ~120 KB at 500x375, quality 90,
    4:2:0, about what an ImageNet photo of that size is."""
    import numpy as np
    from PIL import Image, ImageDraw

    w, h = size
    rng = np.random.default_rng(seed * 1_000_003 + index)
    img = np.zeros((h, w, 3), np.float32)
    for cell, amp in ((120, 60.0), (40, 40.0), (12, 28.0), (4, 20.0)):
        small = rng.normal(0, amp, (h // cell + 2, w // cell + 2, 3)).astype(np.float32)
        img += np.stack([np.asarray(Image.fromarray(small[..., c], mode="F")
                                    .resize((w, h), Image.BICUBIC)) for c in range(3)], -1)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    g = rng.uniform(-1, 1, 3).astype(np.float32)
    img += 128 + (xx / w - 0.5)[..., None] * 90 * g + (yy / h - 0.5)[..., None] * 70 * g[::-1]
    pil = Image.fromarray(img.clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(pil)
    for _ in range(400):
        x0, y0 = int(rng.integers(-20, w)), int(rng.integers(-20, h))
        s = int(rng.integers(4, 60))
        x1, y1 = x0 + s + int(rng.integers(0, 30)), y0 + s + int(rng.integers(0, 30))
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        kind = rng.random()
        if kind < 0.4:
            draw.ellipse((x0, y0, x1, y1), fill=colour)
        elif kind < 0.7:
            draw.rectangle((x0, y0, x1, y1), fill=colour)
        else:
            draw.line((x0, y0, x1, y1), fill=colour, width=int(rng.integers(1, 4)))
    pixels = np.asarray(pil, np.float32) + rng.normal(0, 24.0, (h, w, 3)).astype(np.float32)
    out = io.BytesIO()
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(out, "JPEG", quality=quality)
    return out.getvalue()


def photo_dir(cache: Path) -> Path:
    return Path(cache) / f"augment-photos-v{PHOTO_VERSION}"


def ensure_photos(cache: Path, count: int, log=print) -> Path:
    """Writes files 000000.jpg ... of photo_jpeg once into photo_dir(cache); reuses them."""
    from _compare.workloads import write_once

    return write_once(photo_dir(cache), count, photo_jpeg, log)


# ---- decode once -----------------------------------------------------------------------
def decode_resize(path: str | os.PathLike, size: int = 256) -> torch.Tensor:
    """PIL decode -> shorter side to `size` (bilinear, PIL's antialiased resize, as
    torchvision's Resize(size) on a PIL image) -> centre crop size x size ->
    uint8 tensor 3 x size x size (contiguous)."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as img:
        img = img.convert("RGB")
        w, h = img.size
        if w <= h:
            nw, nh = size, max(size, round(h * size / w))
        else:
            nw, nh = max(size, round(w * size / h)), size
        img = img.resize((nw, nh), Image.BILINEAR)
        left, top = (nw - size) // 2, (nh - size) // 2
        img = img.crop((left, top, left + size, top + size))
        array = np.asarray(img)  # size x size x 3, uint8
    return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()


# ---- augment per trial -----------------------------------------------------------------
def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of one sample's generator: batchcast's own (a consumer with
    transform= seeds each sample's generator with it), so a trial's own
    DataLoader draws exactly what its batchcast consumer would."""
    from batchcast._transform import sample_seed as batchcast_seed

    return batchcast_seed(seed, epoch, index)


def sample_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """A generator for one sample of one trial's epoch, seeded as a batchcast
    consumer seeds it."""
    generator = torch.Generator()
    generator.manual_seed(sample_seed(seed, epoch, index))
    return generator


def _uniform(low: float, high: float, generator: torch.Generator) -> float:
    return float(torch.empty(1).uniform_(low, high, generator=generator))


def random_resized_crop_params(height: int, width: int, generator: torch.Generator,
                               scale: tuple[float, float] = (0.08, 1.0),
                               ratio: tuple[float, float] = (3 / 4, 4 / 3)
                               ) -> tuple[int, int, int, int]:
    """torchvision.transforms.RandomResizedCrop.get_params with an explicit
    generator: (top, left, height, width) of the crop."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * _uniform(scale[0], scale[1], generator)
        aspect = math.exp(_uniform(log_ratio[0], log_ratio[1], generator))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (1,), generator=generator))
            left = int(torch.randint(0, width - w + 1, (1,), generator=generator))
            return top, left, h, w
    in_ratio = width / height  # fallback: the central crop
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        h, w = height, round(height * max(ratio))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def random_resized_crop(image: torch.Tensor, size: int, generator: torch.Generator,
                        scale: tuple[float, float] = (0.08, 1.0),
                        ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> torch.Tensor:
    """image (C x H x W, any dtype) -> float32 C x size x size, bilinear, no antialias."""
    top, left, h, w = random_resized_crop_params(image.shape[-2], image.shape[-1], generator,
                                                 scale, ratio)
    crop = image[:, top:top + h, left:left + w].to(torch.float32)
    return F.interpolate(crop.unsqueeze(0), size=(size, size), mode="bilinear",
                         align_corners=False, antialias=False).squeeze(0)


def random_horizontal_flip(image: torch.Tensor, generator: torch.Generator,
                           p: float = 0.5) -> torch.Tensor:
    if float(torch.rand(1, generator=generator)) < p:
        return image.flip(-1)
    return image


def _grayscale(image: torch.Tensor) -> torch.Tensor:
    r, g, b = image.unbind(-3)
    return (GRAY[0] * r + GRAY[1] * g + GRAY[2] * b).unsqueeze(-3)


def color_jitter(image: torch.Tensor, generator: torch.Generator, brightness: float,
                 contrast: float, saturation: float) -> torch.Tensor:
    """torchvision's ColorJitter (without hue) on a float image in [0, 1]: each
    factor drawn uniformly in [max(0, 1 - s), 1 + s], the three adjustments in a
    random order, each clamped to [0, 1]. Works in place on `image`."""
    order = torch.randperm(3, generator=generator).tolist()
    factors = [_uniform(max(0.0, 1 - s), 1 + s, generator)
               for s in (brightness, contrast, saturation)]
    for op in order:
        f = factors[op]
        if op == 0:  # brightness: blend with black
            image.mul_(f)
        elif op == 1:  # contrast: blend with the mean of the grayscale image
            mean = _grayscale(image).mean()
            image.mul_(f).add_((1 - f) * mean)
        else:  # saturation: blend with the grayscale image
            gray = _grayscale(image)
            image.mul_(f).add_(gray, alpha=1 - f)
        image.clamp_(0.0, 1.0)
    return image


def augment_image(image: torch.Tensor, generator: torch.Generator, strength: float,
                  size: int = 224) -> torch.Tensor:
    """uint8 3 x H x W -> float32 3 x size x size: RandomResizedCrop(size),
    horizontal flip, colour jitter of `strength`, normalise."""
    x = random_resized_crop(image, size, generator)
    x = random_horizontal_flip(x, generator)
    x = x.div_(255.0)  # a tensor of its own: the crop's interpolate made it
    x = color_jitter(x, generator, strength, strength, strength)
    return x.sub_(MEAN).div_(STD)


def augment_sample(sample: Any, generator: torch.Generator, strength: float,
                   size: int = 224) -> tuple:
    """(uint8 image, *rest) -> (float32 image, *rest): one trial's augmentation."""
    image, *rest = sample
    return (augment_image(image, generator, strength, size), *rest)


def make_augment(strength: float, size: int = 224):
    """The per-sample transform of one trial, as bc.Consumer(transform=...) takes it:
    `augment(sample, generator)`; every random choice comes from `generator`."""

    def augment(sample, generator):
        return augment_sample(sample, generator, strength, size)

    augment.strength = strength  # type: ignore[attr-defined]
    return augment


# ---- datasets --------------------------------------------------------------------------
class DecodedImages(Dataset):
    """Sample i: file i % files decoded and resized -> (uint8 3x256x256, label, index)."""

    def __init__(self, folder: str | os.PathLike, length: int, files: int = 0, size: int = 256):
        self.folder, self.length, self.size = str(folder), length, size
        self.files = files or length

    def __len__(self) -> int:
        return self.length

    def path(self, index: int) -> str:
        return os.path.join(self.folder, f"{index % self.files:06d}.jpg")

    def __getitem__(self, index: int):
        return decode_resize(self.path(index), self.size), index % 1000, index


class AugmentedImages(Dataset):
    """DecodedImages + one trial's augmentation (strength, seed), seeded per
    sample by sample_generator(seed, epoch, index): (float32 3x224x224, label, index)."""

    def __init__(self, decoded: DecodedImages, strength: float, seed: int, epoch: int = 0,
                 size: int = 224):
        self.decoded, self.strength, self.seed, self.epoch, self.size = (
            decoded, strength, seed, epoch, size)

    def __len__(self) -> int:
        return len(self.decoded)

    def __getitem__(self, index: int):
        generator = sample_generator(self.seed, self.epoch, index)
        return augment_sample(self.decoded[index], generator, self.strength, self.size)

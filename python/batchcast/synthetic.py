"""A built-in synthetic image dataset with a real CPU pipeline, for demos and
benchmarks: each sample is generated from its index (so consumers can check
what they got) and then cropped, resized, flipped, blurred and normalised,
which costs about as much CPU as decoding and augmenting a small JPEG."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
_STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
_BLUR = (torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0]) / 16).view(1, 1, 1, 5)


class SyntheticImages(Dataset[tuple[torch.Tensor, int, int]]):
    """Sample i -> (float32 image [3, size, size], label i % classes, index i)."""

    def __init__(self, length: int = 4096, size: int = 64, classes: int = 10,
                 seed: int = 0) -> None:
        self.length, self.size, self.classes, self.seed = length, size, classes, seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        if not 0 <= index < self.length:
            raise IndexError(index)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        raw = torch.randint(0, 256, (3, self.size + 16, self.size + 16), dtype=torch.uint8,
                            generator=g)
        top, left = (int(v) for v in torch.randint(0, 17, (2,), generator=g))
        crop = raw[:, top:top + self.size, left:left + self.size].float().div_(255)
        image = F.interpolate(crop[None], scale_factor=1.25, mode="bilinear",
                              align_corners=False)
        image = F.interpolate(image, size=(self.size, self.size), mode="bilinear",
                              align_corners=False)[0]
        if torch.rand((), generator=g) < 0.5:
            image = image.flip(-1)
        channels = image[:, None]
        channels = F.conv2d(F.pad(channels, (2, 2, 0, 0), mode="replicate"), _BLUR)
        channels = F.conv2d(F.pad(channels, (0, 0, 2, 2), mode="replicate"),
                            _BLUR.transpose(2, 3))
        image = (channels[:, 0] - _MEAN) / _STD
        return image, index % self.classes, index

"""The Python producer for examples/cpp/train.cpp: serves a small, learnable
classification set (16 features, 4 classes, and each sample's index) from a
DataLoader.

    python examples/cpp/serve.py cpp-demo [--samples 2048] [--epochs 3] [--consumers 1]
    build/dev/example_train cpp-demo --batch-size 48 --epochs 3
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset

import batchcast as bc


def dataset(samples: int, seed: int = 0) -> TensorDataset:
    """x ~ N(0, 1)^16; the label is the argmax of a fixed linear map of x."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 16, generator=g)
    teacher = torch.randn(16, 4, generator=g)
    y = (x @ teacher).argmax(dim=1)
    return TensorDataset(x, y, torch.arange(samples))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name")
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--consumers", type=int, default=1,
                        help="wait for this many trainers before the first epoch")
    parser.add_argument("--loader-batch-size", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    loader = DataLoader(dataset(args.samples), batch_size=args.loader_batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(1))
    producer = bc.Producer(loader, args.name, epochs=args.epochs, min_consumers=args.consumers)
    print(f"serving '{args.name}': {args.samples} samples, {args.epochs} epochs", flush=True)
    producer.run()
    stats = producer.stats()
    print(f"served {stats['batches_published']} loader batches to {stats['joins']} consumer(s)",
          flush=True)


if __name__ == "__main__":
    main()

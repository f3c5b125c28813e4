"""One trial of a hyperparameter sweep: an ordinary training script whose only
batchcast line is the loader. examples/sweep_script.py and
examples/sweep_optuna.py run it as a subprocess, once per trial.

    python examples/sweep_trial.py --lr 0.05 --batch-size 64 --data NAME     # from a producer
    python examples/sweep_trial.py --lr 0.05 --batch-size 64                 # its own DataLoader

It trains a small CNN on batchcast's synthetic image set and writes one JSON
object (to --out, else stdout): lr, batch_size, loss (the last epoch's mean),
exactly_once (every sample exactly once per epoch) and seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader

import batchcast as bc
from batchcast.synthetic import SyntheticImages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--data",
                        help="batchcast producer name; without it, a DataLoader of its own")
    parser.add_argument("--samples", type=int, default=1024, help="samples per epoch")
    parser.add_argument("--size", type=int, default=64, help="own DataLoader: image side")
    parser.add_argument("--workers", type=int, default=1, help="own DataLoader: num_workers")
    parser.add_argument("--out", help="write the result here instead of stdout")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    if args.data:
        loader = bc.Consumer(args.data, batch_size=args.batch_size)   # the one changed line
    else:
        loader = DataLoader(SyntheticImages(args.samples, size=args.size),
                            batch_size=args.batch_size, num_workers=args.workers)

    model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    started = time.perf_counter()
    exactly_once, loss_mean = True, float("nan")
    for _epoch in range(args.epochs):
        seen, loss_sum = [], 0.0
        for images, labels, index in loader:
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(index)
            seen += index.tolist()
        exactly_once &= sorted(seen) == list(range(args.samples))
        loss_mean = loss_sum / max(len(seen), 1)
    result = {"lr": args.lr, "batch_size": args.batch_size, "loss": loss_mean,
              "exactly_once": exactly_once, "seconds": time.perf_counter() - started}
    text = json.dumps(result)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    sys.exit(0 if exactly_once else 1)


if __name__ == "__main__":
    main()

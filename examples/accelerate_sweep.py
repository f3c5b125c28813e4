"""Two Hugging Face Accelerate training loops fed by one batchcast producer:
`accelerator.prepare(model, optimizer, loader, scheduler)` with a
`batchcast.Consumer` as the loader, gradient accumulation, and a OneCycleLR
scheduler sized from `len(loader)`.

    python examples/accelerate_sweep.py                # producer + 2 trials
    python examples/accelerate_sweep.py --epochs 3 --accumulate 4

What `prepare` does with a Consumer: it returns it as it is. Accelerate
prepares `torch.utils.data.DataLoader`s only (it would rebuild them with a
sampler per process); a Consumer already is the one process's share of the
stream, and its batches are already where they go (host memory; a GPU
producer's GPU). The model, optimizer and scheduler are prepared as usual;
`accelerator.accumulate(model)` counts the steps, so with `--accumulate K`
the optimizer and the scheduler step once every K batches. One difference
from a prepared DataLoader: Accelerate does not see where a Consumer's epoch
ends, so it does not force a step at the end of each epoch; the last
batches of an epoch accumulate into the next one's first step, and the
optimizer steps floor(epochs * len(loader) / K) times in all (size the
scheduler so, as below).

The script serves the loader from a thread and runs each trial as a
subprocess (`--trial`); it checks every sample arrived exactly once per
epoch and the scheduler took exactly the steps it was sized for. Needs
`pip install accelerate` (with `PIP_CONSTRAINT` pinning your torch).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import batchcast as bc


class Points(Dataset):
    """Sample i: 16 features made from i, its class (i % 4), and i itself."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        return torch.randn(16, generator=g) + i % 4, i % 4, i


def trial(args: argparse.Namespace) -> None:
    from accelerate import Accelerator

    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accumulate)
    loader = bc.Consumer(args.data, batch_size=args.batch_size)  # was: DataLoader(...)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    # Optimizer steps: one every K batches of the whole run (see above).
    steps = args.epochs * len(loader) // args.accumulate
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=steps)
    model, optimizer, prepared, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    seen, updates = [], 0
    for _epoch in range(args.epochs):
        ids_of_epoch = []
        for x, y, ids in prepared:
            with accelerator.accumulate(model):
                loss = nn.functional.cross_entropy(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                updates += int(accelerator.sync_gradients)
            ids_of_epoch += ids.tolist()
        seen.append(ids_of_epoch)
    result = {"batch_size": args.batch_size, "lr": args.lr, "prepared_is_the_consumer": prepared is loader,
              "updates": updates, "scheduler_steps": scheduler.scheduler.last_epoch, "sized_for": steps,
              "loss": float(loss.detach()), "seen": seen}
    Path(args.out).write_text(json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--accumulate", type=int, default=2, help="gradient accumulation steps")
    ap.add_argument("--trial", action="store_true", help="(run by the script) one trainer")
    ap.add_argument("--data", default="")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.trial:
        return trial(args)

    name = f"accelerate-{Path(tempfile.mkdtemp()).name}"
    loader = DataLoader(Points(args.samples), batch_size=64, shuffle=True,
                        generator=torch.Generator().manual_seed(1), num_workers=1)
    trials = [(32, 0.1), (48, 0.05)]
    outs = [Path(tempfile.mkdtemp()) / "trial.json" for _ in trials]
    with bc.Producer(loader, name, epochs=args.epochs, min_consumers=len(trials)) as producer:
        procs = [subprocess.Popen([sys.executable, __file__, "--trial", "--data", name,
                                   "--epochs", str(args.epochs), "--batch-size", str(b),
                                   "--lr", str(lr), "--accumulate", str(args.accumulate),
                                   "--out", str(out)])
                 for (b, lr), out in zip(trials, outs)]
        codes = [p.wait() for p in procs]
        joins = producer.stats()["joins"]
    if any(codes):
        sys.exit(f"a trial failed: exit codes {codes}")
    print(f"one producer, {joins} consumers joined (one per trial), {args.epochs} epochs of "
          f"{args.samples} samples, gradients accumulated over {args.accumulate} batches")
    print(f"{'batch':>5} {'lr':>6} {'updates':>8} {'sched.':>7} {'loss':>7}  every sample once per epoch")
    ok = joins == len(trials)
    for out in outs:
        r = json.loads(out.read_text())
        once = all(sorted(ids) == list(range(args.samples)) for ids in r["seen"])
        ok &= once and r["prepared_is_the_consumer"] and r["updates"] == r["sized_for"] \
            and r["scheduler_steps"] == r["sized_for"]
        print(f"{r['batch_size']:>5} {r['lr']:>6} {r['updates']:>8} {r['scheduler_steps']:>7} "
              f"{r['loss']:>7.3f}  {once}")
    if not ok:
        sys.exit("a trial missed or repeated samples, or its optimizer or scheduler took another "
                 "number of steps than len() sized it for")


if __name__ == "__main__":
    main()

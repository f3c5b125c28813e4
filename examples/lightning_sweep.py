"""Two PyTorch Lightning trainers fed by one batchcast producer: the training
loader is a `batchcast.Consumer`, in a LightningDataModule (one trial) or
given to `Trainer.fit` (the other); everything else
(validation loader, `Trainer.fit`, the progress bar, a OneCycleLR scheduler
sized from `trainer.estimated_stepping_batches`) is Lightning's, unchanged.

    python examples/lightning_sweep.py                 # producer + 2 trials
    python examples/lightning_sweep.py --epochs 3 --samples 2048

The script serves the loader from a thread and runs each trial as a
subprocess (`--trial`); each trial reports the sample ids it trained on, and
the script checks every sample arrived exactly once per epoch. Needs
`pip install lightning` (with the torch you have: `PIP_CONSTRAINT` pinning it,
so pip does not fetch another).
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

    def __init__(self, n: int, offset: int = 0):
        self.n, self.offset = n, offset

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(self.offset + i)
        label = (self.offset + i) % 4
        x = torch.randn(16, generator=g) + label
        return x, label, i


def trial(args: argparse.Namespace) -> None:
    import lightning as L

    class Data(L.LightningDataModule):
        def train_dataloader(self):
            return bc.Consumer(args.data, batch_size=args.batch_size)  # was: DataLoader(...)

        def val_dataloader(self):
            return DataLoader(Points(64, offset=10**6), batch_size=32)

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
            self.seen: dict[int, list[int]] = {}

        def training_step(self, batch, batch_idx):
            x, y, ids = batch
            self.seen.setdefault(self.current_epoch, []).extend(ids.tolist())
            loss = nn.functional.cross_entropy(self.net(x), y)
            self.log("loss", loss, prog_bar=True)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y, _ = batch
            self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=args.lr)
            steps = self.trainer.estimated_stepping_batches  # epochs x len(train loader)
            sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps)
            return [opt], [{"scheduler": sched, "interval": "step"}]

    torch.manual_seed(0)
    model = Model()
    trainer = L.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_model_summary=False,
                        enable_progress_bar=False)
    if args.how == "datamodule":
        trainer.fit(model, datamodule=Data())
    else:  # the loaders given to fit() directly
        data = Data()
        trainer.fit(model, train_dataloaders=data.train_dataloader(), val_dataloaders=data.val_dataloader())
    result = {"batch_size": args.batch_size, "lr": args.lr, "how": args.how,
              "steps": trainer.global_step, "estimated_steps": trainer.estimated_stepping_batches,
              "seen": [model.seen.get(e, []) for e in range(args.epochs)],
              "val_loss": float(trainer.callback_metrics["val_loss"])}
    Path(args.out).write_text(json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--trial", action="store_true", help="(run by the script) one trainer")
    ap.add_argument("--data", default="")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--how", choices=["datamodule", "fit"], default="datamodule",
                    help="a LightningDataModule, or the loaders passed to Trainer.fit")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.trial:
        return trial(args)

    name = f"lightning-{Path(tempfile.mkdtemp()).name}"
    loader = DataLoader(Points(args.samples), batch_size=64, shuffle=True,
                        generator=torch.Generator().manual_seed(1), num_workers=1)
    trials = [(32, 0.1, "datamodule"), (48, 0.05, "fit")]
    outs = [Path(tempfile.mkdtemp()) / "trial.json" for _ in trials]
    with bc.Producer(loader, name, epochs=args.epochs, min_consumers=len(trials)) as producer:
        procs = [subprocess.Popen([sys.executable, __file__, "--trial", "--data", name,
                                   "--epochs", str(args.epochs), "--batch-size", str(b),
                                   "--lr", str(lr), "--how", how, "--out", str(out)])
                 for (b, lr, how), out in zip(trials, outs)]
        codes = [p.wait() for p in procs]
        joins = producer.stats()["joins"]
    if any(codes):
        sys.exit(f"a trial failed: exit codes {codes}")
    print(f"one producer, {joins} consumers joined (one per trial), {args.epochs} epochs of "
          f"{args.samples} samples")
    print(f"{'batch':>5} {'lr':>6} {'given as':>10} {'steps':>6} {'val loss':>9}  every sample once per epoch")
    ok = True
    for out in outs:
        r = json.loads(out.read_text())
        once = all(sorted(ids) == list(range(args.samples)) for ids in r["seen"])
        ok &= once and r["steps"] == r["estimated_steps"]
        print(f"{r['batch_size']:>5} {r['lr']:>6} {r['how']:>10} {r['steps']:>6} {r['val_loss']:>9.3f}  {once}")
    if not ok or joins != len(trials):
        sys.exit("a trial missed or repeated samples, or took another number of steps than "
                 "Lightning estimated from len()")


if __name__ == "__main__":
    main()

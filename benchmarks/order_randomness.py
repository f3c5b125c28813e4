"""What joining any time does to the order's randomness: a sample's position
from epoch to epoch under the producer's block-keeping order (batchcast._order)
against a plain shuffled DataLoader.

    python benchmarks/order_randomness.py                 # N=10,000, 40 epochs (seconds)
    python benchmarks/order_randomness.py --samples 100000 --epochs 20

While consumers that joined mid-epoch are present, the producer keeps the
samples between consecutive join positions the same set from epoch to epoch
(in a fresh order within each block). Measured over consecutive epochs, for
a plain DataLoader (no join positions) and for join positions that last the
whole run (the worst case: a join position goes when its consumer leaves):

- |moved| / N: how far a sample moves between epochs (uniform shuffles: 1/3);
- Spearman rho: correlation of its positions in consecutive epochs (0: none);
- P(first half | first half): whether a sample in the epoch's first half is
  there again in the next (0.5 with no structure);
- first-half share spread: the standard deviation over samples of the
  share of epochs each spends in the first half (binomial: 0.5/sqrt(epochs)).

Prints a markdown table; writes benchmarks/results/order_randomness.md.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
from pathlib import Path

import torch
from torch.utils.data import BatchSampler, RandomSampler

from batchcast._order import BlockOrder

HERE = Path(__file__).resolve().parent


def positions(order: list[int]) -> torch.Tensor:
    where = torch.empty(len(order), dtype=torch.int64)
    where[torch.as_tensor(order)] = torch.arange(len(order))
    return where


def measure(n: int, epochs: int, joined_at: list[int], seed: int) -> dict[str, float]:
    sampler = BatchSampler(RandomSampler(range(n), generator=torch.Generator().manual_seed(seed)),
                           64, False)
    order = BlockOrder(sampler, n)
    order.keep([])
    epoch0 = [i for b in order for i in b]  # joins happen during the first epoch
    where = [positions(epoch0)]
    for _ in range(epochs - 1):
        order.keep(joined_at)
        where.append(positions([i for b in order for i in b]))
    moved, rho, stay = [], [], []
    for a, b in zip(where, where[1:]):
        moved.append(float((a - b).abs().double().mean()) / n)
        ra, rb = a.double() - (n - 1) / 2, b.double() - (n - 1) / 2
        rho.append(float((ra * rb).sum() / (ra.square().sum() * rb.square().sum()).sqrt()))
        first = a < n // 2
        stay.append(float((b[first] < n // 2).double().mean()))
    share = torch.stack([w < n // 2 for w in where]).double().mean(0)
    return {"moved": statistics.median(moved), "rho": statistics.median(rho),
            "stay": statistics.median(stay), "spread": float(share.std())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    n = args.samples
    cases = [("plain DataLoader order (nobody joined mid-epoch)", []),
             ("1 join position at N/2", [n // 2 // 64 * 64]),
             ("1 join position at N/10", [n // 10 // 64 * 64]),
             ("4 join positions (N/5 apart)", [k * n // 5 // 64 * 64 for k in range(1, 5)]),
             ("16 join positions (N/17 apart)", [k * n // 17 // 64 * 64 for k in range(1, 17)])]
    lines = [f"# Order randomness with join positions (N={n:,}, {args.epochs} epochs, batch 64)", "",
             f"`python benchmarks/order_randomness.py --samples {n} --epochs {args.epochs}`, "
             f"{datetime.date.today()}, torch {torch.__version__}. Medians over consecutive epochs; "
             "join positions present for the whole run (the worst case).", "",
             "| order | \\|moved\\| / N | Spearman rho | P(first half again) | first-half share spread |",
             "|---|---|---|---|---|"]
    for label, cuts in cases:
        m = measure(n, args.epochs, cuts, args.seed)
        lines.append(f"| {label} | {m['moved']:.3f} | {m['rho']:+.3f} | {m['stay']:.3f} | "
                     f"{m['spread']:.3f} |")
    lines += ["", f"(binomial spread with no structure: {0.5 / args.epochs ** 0.5:.3f})"]
    text = "\n".join(lines) + "\n"
    print(text)
    out = HERE / "results" / "order_randomness.md"
    out.write_text(text)


if __name__ == "__main__":
    main()

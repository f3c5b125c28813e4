"""A speech-like sweep of K trials with different batch sizes: one batchcast
producer decoding WAV files into log-mel features for all of them (each
trial re-pads its own batches), against a DataLoader per trial doing the
decoding and features itself (what users do today).

    python benchmarks/speech.py [--ks 1 2 4] [--repeats 3] [--utterances 384] [--epochs 1]

The sweep is examples/speech_sweep.py (its trials, batch sizes 8, 12, 20, 32,
check every batch as they train). Reports per K and system: utterances per
second while the trials train (K x epochs x utterances over the time from
the first trial's asking for its loader, model and optimizer made, to the
last trial's end: the processes' start-up and imports, the same both ways,
left out; a
DataLoader's workers starting, and a consumer connecting, kept in), the
same over the sweep's whole
wall time, CPU milliseconds per utterance delivered (every process, start-up
included), and whether every trial saw
every utterance once per epoch; medians [min, max] of the repeats, the
systems alternated. Beside them the bound: D, the decoding and features per
utterance measured alone in this process, and T, a trial's own work per
utterance (measured: a trial over features already in memory); K trials cost
D + K·T per utterance shared against K·(D + T) apart, so with the CPUs busy
both ways sharing delivers at most K·(D + T) / (D + K·T) as much. (Each
loader has --workers workers, 2 by default: the producer's can use both
CPUs, as K trials' own loaders together can.)
The producer runs in this process, which decodes nothing itself (as
`batchcast serve`), so its loader's workers start as cold as a trial's own:
D and T are measured in a process of their own. Writes
benchmarks/results/speech.{md,json}.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("speech_sweep", HERE.parent / "examples" / "speech_sweep.py")
assert spec is not None and spec.loader is not None
speech = importlib.util.module_from_spec(spec)
spec.loader.exec_module(speech)


def median_range(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}, {max(values):.{digits}f}]"


def decode_cost(folder: Path, count: int) -> float:
    """Seconds of decoding and features per utterance, in this process."""
    data = speech.Utterances(folder, count)
    started = time.perf_counter()
    for i in range(count):
        data[i]
    return (time.perf_counter() - started) / count


def trial_cost(folder: Path, count: int) -> float:
    """Seconds of a trial's own work per utterance: its training and checks
    over loader batches already in memory (batch size 8, the smallest trial's)."""
    data = speech.Utterances(folder, count)
    batches = [speech.pad_collate([data[i] for i in range(s, min(count, s + 8))]) for s in range(0, count, 8)]
    model = torch.nn.Linear(speech.MELS, speech.CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    started = time.perf_counter()  # wall: torch's own threads count too
    for batch in batches:
        features, mask = batch["features"], batch["mask"]
        lengths = mask.sum(1)
        for r, i in enumerate(batch["index"].tolist()):
            _ = int(lengths[r]) == speech.frames(i) and bool(mask[r, :speech.frames(i)].all())
            _ = not features[r, speech.frames(i):].any()
        pooled = (features * mask[..., None]).sum(1) / lengths[:, None]
        loss = torch.nn.functional.cross_entropy(model(pooled / 10), batch["label"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return (time.perf_counter() - started) / count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--utterances", type=int, default=512)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers: the producer's, and each trial's own apart")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:  # in a process of its own: torch's caches (FFT plans) stay out of the producer's
        folder = Path(args.measure)
        print(json.dumps([decode_cost(folder, min(args.utterances, 128)),
                          trial_cost(folder, min(args.utterances, 128))]))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="batchcast-speech-bench-") as tmp:
        folder = Path(tmp)
        speech.write_wavs(folder, args.utterances)
        measured = subprocess.run([sys.executable, __file__, "--measure", str(folder), "--utterances",
                                   str(args.utterances)], capture_output=True, text=True, check=True)
        d, t = json.loads(measured.stdout.strip().splitlines()[-1])
        for k in args.ks:
            runs: dict[str, list[tuple[float, float, bool, float]]] = {"batchcast": [], "dataloader": []}
            for _ in range(args.repeats):
                for system in ("batchcast", "dataloader"):
                    sweep_args = argparse.Namespace(trials=k, epochs=args.epochs, utterances=args.utterances,
                                                    workers=args.workers)
                    results, wall, cpu = speech.sweep(sweep_args, folder, shared=system == "batchcast")
                    training = max(r["done"] for r in results) - min(r["started"] for r in results)
                    runs[system].append((wall, cpu, all(r["exact"] for r in results), training))
                    print(f"K={k} {system:10s} wall {wall:6.2f} s, training {training:6.2f} s, CPU {cpu:6.2f} s, "
                          f"exact {all(r['exact'] for r in results)}", flush=True)
            delivered = k * args.epochs * args.utterances
            for system, values in runs.items():
                rows.append({"k": k, "system": system,
                             "utterances_per_s": [delivered / t for _, _, _, t in values],
                             "utterances_per_s_wall": [delivered / w for w, _, _, _ in values],
                             "cpu_ms_per_utterance": [1000 * c / delivered for _, c, _, _ in values],
                             "exact": all(e for _, _, e, _ in values)})
            shared = statistics.median(delivered / t for _, _, _, t in runs["batchcast"])
            apart = statistics.median(delivered / t for _, _, _, t in runs["dataloader"])
            rows[-2]["speedup"] = shared / apart
            rows[-2]["bound"] = k * (d + t) / (d + k * t)

    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                         text=True).stdout.strip()
    head = (f"{time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, "
            f"{len(__import__('os').sched_getaffinity(0))} CPUs, torch {torch.__version__}, git {git}. "
            f"{args.utterances} utterances (0.4-2 s, 44.1 kHz WAV resampled to 16 kHz, 40 log-mel bands) x {args.epochs} epoch(s), loader batch 16, "
            f"{args.workers} loader worker(s) (the producer's; each trial's own apart), "
            f"{args.repeats} repeats, systems alternated.")
    lines = ["# Speech sweep: one producer decoding for K trials vs a DataLoader per trial", "", head, "",
             f"Measured alone: decoding + log-mel D = {1000 * d:.2f} ms per utterance; a trial's own work "
             f"T = {1000 * t:.2f} ms per utterance. Bound on the speed-up from sharing: K·(D + T) / (D + K·T).",
             "", "| K | system | utterances/s training | utterances/s, whole sweep | CPU ms per utterance | "
             "exactly once | speed-up (training) | bound |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        ratio = (f"{row['speedup']:.2f}x | {row['bound']:.2f}x" if "speedup" in row else " | ")
        lines.append(f"| {row['k']} | {row['system']} | {median_range(row['utterances_per_s'])} | "
                     f"{median_range(row['utterances_per_s_wall'])} | "
                     f"{median_range(row['cpu_ms_per_utterance'], 2)} | {row['exact']} | {ratio} |")
    text = "\n".join(lines) + "\n"
    print(text)
    (out / "speech.md").write_text(text)
    (out / "speech.json").write_text(json.dumps({"head": head, "decode_s": d, "trial_s": t, "rows": rows},
                                                indent=1))


if __name__ == "__main__":
    main()
